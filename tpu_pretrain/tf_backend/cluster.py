"""Training on several machines with TensorFlow's own engine: MultiWorkerMirroredStrategy over GPU or CPU
machines, configured from ``TF_CONFIG`` or from ``--worker_hosts``/``--task_index``.

Every worker runs the same command on the same run folder (a shared disk, or the checkpoint mirror);
each input pipeline keeps its share of the one global order (:mod:`.input`), so N workers see the same
global batches as one process. One writer: the chief (task 0) alone holds the run folder's lock and
writes checkpoints, logs and the mirror; the others take part in every save (TensorFlow's saves may
hold collective operations) into a scratch folder they delete, and restore from the chief's
checkpoints. A stop (deadline, SIGTERM) on any worker is agreed by all, so none waits forever for a
step the others will not run; before the strategy connects them, :mod:`.setup.workers` has waited (named, bounded,
stoppable) until every worker is up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .framework import tf
from .setup.workers import find_workers

log = logging.getLogger(__name__)


@dataclass
class Cluster:
    """This process's place among the training workers."""

    workers: list[str]
    task_index: int
    resolver: tf.distribute.cluster_resolver.ClusterResolver

    @property
    def is_chief(self) -> bool:
        return self.task_index == 0


def find_cluster(worker_hosts: str = "", task_index: int = 0) -> Cluster | None:
    """The cluster named by the flags, else by ``TF_CONFIG`` (checked by :func:`.setup.workers.find_workers`); None for
    one machine."""
    workers = find_workers(worker_hosts, task_index)
    if workers is None:
        return None
    resolvers = tf.distribute.cluster_resolver
    if workers.source == "TF_CONFIG":
        resolver = resolvers.TFConfigClusterResolver()
    else:
        spec = tf.train.ClusterSpec({"worker": list(workers.addresses)})
        resolver = resolvers.SimpleClusterResolver(spec, task_type="worker", task_id=workers.index, rpc_layer="grpc")
    return Cluster(list(workers.addresses), workers.index, resolver)


def multi_worker_strategy(cluster: Cluster) -> tf.distribute.Strategy:
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.AUTO)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster.resolver,
                                                         communication_options=options)
    log.info("Worker %d of %d (%s).", cluster.task_index, len(cluster.workers),
             "chief: writes the run folder" if cluster.is_chief else "follows the chief")
    return strategy


def any_worker(strategy: tf.distribute.Strategy, flag: bool) -> bool:
    """Whether ``flag`` is true on any worker (an all-reduce: every worker must call it at the same step)."""
    value = strategy.run(lambda: tf.constant(1.0 if flag else 0.0))
    return bool(strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None).numpy() > 0)
