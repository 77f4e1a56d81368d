"""The run core: what a training run is, whatever framework trains it. Imports neither TensorFlow nor JAX.

- ``resolve``, ``bert_config``: a run's settings completed from its data, and the model's shape.
- ``protocol``: what the loop needs of a backend's trainer; ``loop``: resume, train, log, evaluate, save, stop.
- ``schedules``: the learning-rate schedules as pure functions, and their re-planning on resume.
- ``metrics``: the one MLM/NSP statistics formula and its means.
- ``checkpoints``, ``mirror``: atomic, verified checkpoints and their background copy.
- ``run_folder``: the contract of a run folder; ``run_lock``, ``session``, ``event_log``, ``status``.
- ``weight_names``: Google's and Hugging Face's weight names and files, with NumPy alone.
"""
