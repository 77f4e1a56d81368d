"""Data preparation: corpus -> vocab -> pretraining instances -> TFRecord shards + manifest.json.

Nothing here imports TensorFlow (a test holds it to that), so the data steps run, and run fast, on
machines and images without it.

- ``corpus``: read and normalise raw text as a stream of documents.
- ``corpus_files``: one corpus file opened: compression recognised by content, archives and non-text refused.
- ``corpus_tables``: parquet tables as corpus input: a row a document, streamed a row group at a time.
- ``hub_datasets``: ``hf://datasets/...`` resolved to a commit and a split's parquet files (or a local mirror).
- ``corpus_hints``: what create-data says when a corpus's structure looks guessed wrong (a marker line that may
  separate documents, a held-out share far from ``--eval_fraction``).
- ``sample_corpus``: the built-in demo corpus (the standard library's docstrings).
- ``random_data``: a data folder of random tokens, for the accelerator checks and the benchmarks.
- ``vocab``: the special tokens, reading a ``vocab.txt``, building one with SentencePiece.
- ``vocab_tokenizer``: what every vocab's tokenizer offers (a ``vocab.txt``'s and a ``tokenizer.json``'s alike).
- ``tokenization``: BERT's WordPiece tokenisation through Hugging Face ``tokenizers``.
- ``wordpiece_kernel``: BERT's tokenisation of ASCII words, compiled (numba), the same ids as ``tokenizers``.
- ``tokenizer_json``: a Hugging Face ``tokenizer.json`` as the vocab (a released ModernBERT's byte-level BPE).
- ``instances``: segment pairs and masking, as Google's ``create_pretraining_data.py``.
- ``pair_loop``: Google's segment-pair loop, compiled (numba), drawing from the caller's ``random.Random``.
- ``python_random``: a ``random.Random``'s draws made in compiled code, continuing the very same stream.
- ``masking_kernels``: laying out and masking a batch of instances, token by token, compiled (numba).
- ``dynamic_masking``: masks drawn afresh each time a sequence is read: the one rule both backends follow.
- ``tfrecord``: the TFRecord and ``tf.train.Example`` wire format, written and read without TensorFlow.
- ``example_encoder``: a batch of ``tf.train.Example`` records encoded and framed in one compiled pass.
- ``compiled``: numba's ``njit`` with its on-disk cache kept working (a temporary folder, damaged files rebuilt).
- ``data_folder``: the contract of a data folder (shard names, feature spec, ``manifest.json``, ``DataInfo``).
- ``shard``: one shard's work, from its documents to its records.
- ``shard_writer``: a shard's compiled side (tokenise, pair, mask, encode), loaded only where shards are written.
- ``shard_pool``: the worker processes that write shards, watched: one that dies stops create-data, naming its shard.
- ``create``: ``create-data`` itself: partition the corpus, write the shards in parallel, the manifest.
- ``beam_pipeline``: create-data on Apache Beam (Dataflow, Flink, Spark): the same shards by the same per-shard code.
"""
