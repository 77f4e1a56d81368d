"""What a model is, whatever framework trains it (imports neither TensorFlow nor JAX; NumPy alone).

- ``families``: the model families (BERT, ModernBERT), one record each: the one place that names them.
- ``bert_config``, ``modernbert_config``: each family's shape, its named sizes and FLOPs formula.
- ``shape_request``: what a run asks of its shape, one request for every family, and each family's resolver of it.
- ``weight_names``, ``tf_bundle``, ``run_weights``: weights as checkpoints and exports store them, read with NumPy.
- ``inference``: what evaluate, fill-mask, the probe and export need of a built model, both backends alike.
"""
