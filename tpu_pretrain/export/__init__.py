"""Using a trained model: rebuild it, evaluate it, fill masks, export it, draw its curves.

- ``rebuild``: a run's (or a released checkpoint's) model with its vocab and casing, on the backend that trained
  the run (:class:`..models.inference.InferenceModel`), and a run's weights by Google name.
- ``evaluate``: held-out MLM/NSP figures and ``evaluation.json``.
- ``fill_mask``: whole-word fill-mask predictions for sentences with ``[MASK]`` slots.
- ``writers``: the Hugging Face folder and Google's original TF checkpoint.
- ``plots``: the loss and accuracy curves from the TensorBoard logs.
- ``probe``: is the encoder any good: a small labelled task, pretrained against random initialisation.
- ``blimp``: ``evaluate --blimp``: BLiMP's minimal pairs scored by pseudo-log-likelihood.
- ``blimp_results``: BLiMP's figures beside random inits of the model's shape, the summary printed, ``blimp.json``.
- ``folder``: what every export shares: the destination checked, the folder swapped in, the tokenizer files.
- ``hf_modernbert``: ModernBERT as a transformers folder, written, and read back for continued pretraining.
"""

# The export formats, the heads a Hugging Face export may carry and the probe's modes (here, so the CLI can
# offer them without importing either backend).
FORMATS = ("hf", "tf")
HEADS = ("all", "mlm", "encoder")
PROBE_MODES = ("features", "finetune")
