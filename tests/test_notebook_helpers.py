"""The helpers the notebooks call, outside a notebook."""

from tpu_pretrain import notebook


def test_keep_alive_is_a_no_op_outside_colab_and_the_script_can_be_pasted():
    assert "Not on Colab" in notebook.set_keep_alive(True)
    script = notebook.keep_alive_script(30)
    assert "colab-connect-button" in script and "30 * 1000" in script
