"""create-data on Apache Beam (``--runner DirectRunner|DataflowRunner|FlinkRunner|SparkRunner``): the local
path's shards and manifest, written by a runner's workers.

Pass 1 stays one reader, as locally: it streams the corpus and gives each document its shard
(:class:`.create.Dealer`), so every shard holds the same documents in the same order. Pass 2 is the
Beam stage: documents are grouped by shard, put back in corpus order and handed to the same per-shard
code the local worker processes run (:func:`.shard.write_shard`). A shard depends only on its
documents, the seed and its index, so the bytes are the same. A worker holds one shard's text at a
time (about 16 MB by default; more shards, smaller ones) plus the block being tokenised. For a
``gs://`` output each shard is written on the worker's disk and uploaded; on Dataflow the corpus must
be where the workers can read it (``gs://`` or ``https://``).
"""

from __future__ import annotations

import io
import json
import logging
import shlex
import tempfile
import time
from pathlib import Path

from ..config import Config
from ..errors import UserInputError
from ..storage.gcs import is_gcs_url
from ..storage.local import check_writable_folder
from .corpus import CorpusReader
from .create import DataPlan, Dealer, check_existing, check_required, finish, plan_data
from .data_folder import IDENTITY, WORK_DIR, Manifest, ShardStats, shard_name, shard_stats_name
from .shard import ShardTask, work_text, write_json, write_shard
from .vocab import Vocab

log = logging.getLogger(__name__)

RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner", "PortableRunner")
PARTITION = "partition.json"


def import_beam():
    try:
        import apache_beam as beam
    except ImportError:
        raise UserInputError("--runner needs Apache Beam: pip install 'tpu_pretrain[beam]' (or apache-beam[gcp] "
                             "for Dataflow).") from None
    return beam


def run_beam(config: Config) -> Manifest:
    """Write the shards and manifest for ``config`` with the Beam runner it names."""
    check_required(config)
    runner = config.data.runner
    if runner not in RUNNERS:
        raise UserInputError(f"--runner {runner} is not one this tool knows: use one of {', '.join(RUNNERS)}.")
    out = config.storage.output_dir
    if not is_gcs_url(out):
        out = str(check_writable_folder(out))
    plan = plan_data(config)
    plan.out = out
    if not is_gcs_url(out):
        check_existing(Path(out), plan.identity, plan.vocab)
        Path(out).mkdir(parents=True, exist_ok=True)
        write_json(Path(out) / IDENTITY, plan.identity)
    beam = import_beam()
    from apache_beam.options.pipeline_options import PipelineOptions

    start = time.time()
    options = PipelineOptions(shlex.split(config.data.beam_options), runner=runner)
    with beam.Pipeline(options=options) as pipeline:
        dealt = (pipeline | "Start" >> beam.Create([None])
                 | "Deal documents" >> beam.FlatMap(DealDocuments(plan)).with_outputs(PARTITION, main="documents"))
        _ = dealt[PARTITION] | "Keep partition" >> beam.Map(_save_partition, out)
        tasks = dealt[PARTITION] | "Shards" >> beam.FlatMap(_shard_keys)
        _ = ({"documents": dealt.documents, "count": tasks} | "By shard" >> beam.CoGroupByKey()
             | "Write shards" >> beam.Map(WriteShard(plan)))
    return _manifest(plan, time.time() - start)


class DealDocuments:
    """Pass 1 on one element: ``((split, index), (position, work text))`` for every document, and the
    partition (counts, corpus report) on the ``partition.json`` output."""

    def __init__(self, plan: DataPlan):
        c = plan.config
        self.inputs, self.corpus, self.lower = list(c.corpus.input), c.corpus, c.data.do_lower_case
        self.settings, self.identity = plan.settings, plan.identity

    def __call__(self, _):
        from apache_beam import pvalue

        reader = CorpusReader(self.inputs, self.corpus, do_lower_case=self.lower)
        dealer = Dealer(self.settings)
        for position, (split, index, doc) in enumerate(dealer.deal(reader.documents())):
            yield (split, index), (position, work_text(doc))
        partition = dealer.partition(reader, self.identity)
        if partition["documents"]["train"] == 0:
            raise UserInputError(f"The corpus ({', '.join(reader.files[:3])}) has no usable line: "
                                 f"{partition['corpus_report']}.")
        yield pvalue.TaggedOutput(PARTITION, partition)



def _shard_keys(partition: dict):
    return [((split, index), count) for split, count in partition["shard_counts"].items() for index in range(count)]


class WriteShard:
    """Pass 2 for one shard: its documents in corpus order, through the local path's :func:`write_shard`."""

    def __init__(self, plan: DataPlan):
        self.out, self.settings = plan.out, plan.settings
        self.vocab_text = plan.vocab.source.read_text(encoding="utf-8")  # workers lack the file
        self.vocab_name = plan.vocab.copy_name

    def __call__(self, element) -> dict:
        (split, index), grouped = element
        count = grouped["count"][0]
        text = "".join(work for _, work in sorted(grouped["documents"]))
        with tempfile.TemporaryDirectory() as scratch:
            vocab = Path(scratch) / self.vocab_name
            vocab.write_text(self.vocab_text, encoding="utf-8")
            local = not is_gcs_url(self.out)
            task = ShardTask(split, index, count, self.out if local else scratch, "", Vocab.read(vocab), self.settings)
            stats = write_shard(task, io.StringIO(text))
            if not local:
                from .. import storage

                for name in (task.name, shard_stats_name(task.name)):
                    storage.copy(Path(scratch) / name, storage.join(self.out, name))
        return stats.__dict__


def _save_partition(partition: dict, out: str) -> None:
    from .. import storage

    storage.write_text(storage.join(out, WORK_DIR, PARTITION), json.dumps(partition))


def _manifest(plan: DataPlan, seconds: float) -> Manifest:
    """The manifest from what the workers left: the partition, and each shard's statistics beside it."""
    from .. import storage

    partition = json.loads(storage.read_text(storage.join(plan.out, WORK_DIR, PARTITION)))
    names = [shard_name(split, index, count) for (split, index), count in _shard_keys(partition)]
    shards = [ShardStats(**json.loads(storage.read_text(storage.join(plan.out, shard_stats_name(name)))))
              for name in names]
    manifest = finish(plan, partition, shards, seconds)
    storage.delete(storage.join(plan.out, WORK_DIR), recursive=True)
    return manifest
