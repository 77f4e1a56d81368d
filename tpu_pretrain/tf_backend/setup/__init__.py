"""The TensorFlow backend's set-up: what prepares a machine for it, without importing TensorFlow.

The command line (``tpu-env``, ``tpu-check``), the notebooks' kernels and ``train`` use these before TensorFlow may
be loaded, or where it must never be (a kernel on a TPU runtime), so nothing here imports it, and the backend's
package (:mod:`tpu_pretrain.tf_backend`) loads it only in the modules that train.

- ``tpu_stack``: the pinned TPU set, and what an environment holds of it (names, RECORD hashes).
- ``tpu_diagnosis``: why the TPU cannot be used: the cause and the fix for each failure seen in the wild.
- ``tpu_env``: the TPU environment (Python 3.12 and the pinned set, checked), with ``tpu-pretrain`` run inside it.
- ``workers``: several machines (``--worker_hosts`` or ``TF_CONFIG``) checked, and the bounded wait for the others.
"""
