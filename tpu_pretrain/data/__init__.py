"""Data preparation: corpus -> vocab -> pretraining instances -> TFRecord shards + manifest.json.

Nothing here imports TensorFlow (a test holds it to that), so the data steps run, and run fast, on
machines and images without it.

- ``corpus``: read and normalise raw text as a stream of documents.
- ``sample_corpus``: the built-in demo corpus (the standard library's docstrings).
- ``vocab``: the special tokens, reading a ``vocab.txt``, building one with SentencePiece.
- ``tokenization``: BERT's WordPiece tokenisation through Hugging Face ``tokenizers``.
- ``instances``: segment pairs and masking, as Google's ``create_pretraining_data.py``.
- ``tfrecord``: the TFRecord and ``tf.train.Example`` wire format, written and read without TensorFlow.
- ``data_folder``: the contract of a data folder (shard names, feature spec, ``manifest.json``, ``DataInfo``).
- ``shard``: one shard's work, from its documents to its records.
- ``create``: ``create-data`` itself: partition the corpus, write the shards in parallel, the manifest.
"""
