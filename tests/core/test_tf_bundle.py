"""tf_bundle reads what TensorFlow writes: every tensor of real TF checkpoints byte for byte, and clear errors.

TensorFlow writes the checkpoints (Google's v1 Saver layout, TF2's object-based one, several data shards)
and reads them back as the reference; the reader itself never imports it. A few bundles are written by hand
(big-endian, compressed, headerless), and TensorFlow reads the big-endian one too, to check the writer.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tpu_pretrain.errors import UserInputError
from tpu_pretrain.models import tf_bundle
from tpu_pretrain.wire_format import FIXED32, VARINT, length_delimited, masked_crc, tag, varint

ROOT = Path(__file__).resolve().parents[2]
EMBEDDINGS = "bert/embeddings/word_embeddings"
QUERY = "bert/encoder/layer_0/attention/self/query/kernel"
PARTITIONED = "bert/partitioned"


def google_weights() -> dict[str, tuple[np.ndarray, str]]:
    """Google's BERT names with Adam slots and global_step, plus one tensor of every supported dtype."""
    rng = np.random.default_rng(0)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    embeddings = normal(12, 4)
    embeddings[0] = [np.inf, -np.inf, -0.0, np.nan]  # bytes, not values, must survive
    return {
        EMBEDDINGS: (embeddings, "float32"), f"{EMBEDDINGS}/adam_m": (normal(12, 4), "float32"),
        f"{EMBEDDINGS}/adam_v": (normal(12, 4), "float32"),
        QUERY: (normal(4, 4), "float32"), f"{QUERY}/adam_m": (normal(4, 4), "float32"),
        f"{QUERY}/adam_v": (normal(4, 4), "float32"),
        "bert/encoder/layer_0/attention/self/query/bias": (normal(4), "bfloat16"),
        "bert/encoder/layer_0/output/LayerNorm/gamma": (normal(4), "float16"),
        "cls/predictions/output_bias": (normal(12), "float32"),
        "cls/seq_relationship/output_weights": (normal(2, 4).astype(np.float64), "float64"),
        "global_step": (np.int64(12345), "int64"),
        "misc/int32": (np.arange(-3, 3, dtype=np.int32), "int32"),
        "misc/int16": (np.array([-300, 7], np.int16), "int16"),
        "misc/int8": (np.array([-128, 127], np.int8), "int8"),
        "misc/uint8": (np.array([0, 255], np.uint8), "uint8"),
        "misc/bool": (np.array([True, False, True]), "bool"),
        "misc/scalar": (np.float32(2.5), "float32"),
        "misc/empty": (np.zeros((0, 4), np.float32), "float32"),
    }


def save_v1(tf, prefix: Path, weights: dict, sharded: bool = False, partitioned: bool = False) -> str:
    """As Google's scripts saved: tf.compat.v1.train.Saver in a graph session (2 CPU devices when sharded)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with tf.Graph().as_default():
        for i, (name, (value, dtype)) in enumerate(weights.items()):
            with tf.device(f"/cpu:{i % 2 if sharded else 0}"):
                tf.compat.v1.get_variable(name, initializer=tf.constant(value, dtype=getattr(tf, dtype)))
        if partitioned:
            tf.compat.v1.get_variable(PARTITIONED, shape=[4, 3], partitioner=tf.compat.v1.fixed_size_partitioner(2))
        saver = tf.compat.v1.train.Saver(sharded=sharded)
        with tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(device_count={"CPU": 2})) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(session, str(prefix), write_meta_graph=False)


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def google_v1(tf, tmp_path_factory):
    return save_v1(tf, tmp_path_factory.mktemp("google") / "bert_model.ckpt", google_weights())


@pytest.fixture(scope="module")
def sharded_v1(tf, tmp_path_factory):
    return save_v1(tf, tmp_path_factory.mktemp("sharded") / "model.ckpt-3", google_weights(), sharded=True,
                   partitioned=True)


@pytest.fixture(scope="module")
def tf2_folder(tf, tmp_path_factory):
    """TF2 object-based names, saved twice (ckpt-1, ckpt-2) so the ``checkpoint`` file picks the later."""
    model = tf.Module()
    model.bert = tf.Module()
    model.bert.word_embeddings = tf.Variable(np.arange(24, dtype=np.float32).reshape(6, 4))
    model.bert.bias = tf.Variable(tf.constant([1.5, -2.0, 3.25], tf.bfloat16))
    model.step = tf.Variable(np.int64(7))
    folder = tmp_path_factory.mktemp("tf2")
    checkpoint = tf.train.Checkpoint(model=model)
    checkpoint.save(str(folder / "ckpt"))
    model.bert.word_embeddings.assign_add(tf.ones((6, 4)))
    checkpoint.save(str(folder / "ckpt"))
    return folder


def tensorflow_tensors(tf, prefix: str) -> dict[str, np.ndarray]:
    """TF's own reading, bfloat16 as float32 (what tf_bundle returns); string tensors left out."""
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    out = {}
    for name, dtype in dtypes.items():
        if dtype != tf.string and name != PARTITIONED:
            value = reader.get_tensor(name)
            out[name] = value.astype(np.float32) if dtype == tf.bfloat16 else np.asarray(value)
    return out


def assert_same_as_tensorflow(tf, prefix: str, names: list[str] | None = None) -> dict[str, np.ndarray]:
    expected = tensorflow_tensors(tf, prefix)
    got = tf_bundle.read_tensors(prefix, names)
    assert sorted(got) == sorted(expected)
    listed = tf_bundle.list_tensors(prefix)
    assert sorted(listed) == sorted(tf.train.load_checkpoint(prefix).get_variable_to_shape_map())
    for name, value in got.items():
        assert (value.dtype, value.shape) == (expected[name].dtype, expected[name].shape), name
        assert value.tobytes() == expected[name].tobytes(), name
        assert listed[name] == (value.dtype, value.shape), name
    return got


def test_google_release_layout_matches_tensorflow(tf, google_v1):
    got = assert_same_as_tensorflow(tf, google_v1)
    assert set(got) == set(google_weights())
    assert got["global_step"].dtype == np.int64 and got["global_step"] == 12345
    assert got["misc/empty"].shape == (0, 4) and got["misc/scalar"].shape == ()
    assert {str(v.dtype) for v in got.values()} == {"float32", "float16", "float64", "int64", "int32", "int16",
                                                    "int8", "uint8", "bool"}
    assert got[f"{QUERY}/adam_m"].flags.writeable


def test_tf2_object_based_checkpoint_matches_tensorflow_without_its_object_graph(tf, tf2_folder):
    prefix = str(tf2_folder / "ckpt-2")
    got = assert_same_as_tensorflow(tf, prefix)
    assert "model/bert/word_embeddings/.ATTRIBUTES/VARIABLE_VALUE" in got
    assert got["model/bert/bias/.ATTRIBUTES/VARIABLE_VALUE"].tolist() == [1.5, -2.0, 3.25]
    assert "_CHECKPOINTABLE_OBJECT_GRAPH" not in got  # a string tensor: listed, skipped, refused by name
    assert tf_bundle.list_tensors(prefix)["_CHECKPOINTABLE_OBJECT_GRAPH"] == (np.dtype(object), ())
    with pytest.raises(UserInputError, match="_CHECKPOINTABLE_OBJECT_GRAPH in .*ckpt-2.index is a string tensor"):
        tf_bundle.read_tensors(prefix, ["_CHECKPOINTABLE_OBJECT_GRAPH"])


def test_named_tensors_only_and_an_unknown_name(google_v1):
    got = tf_bundle.read_tensors(google_v1, [QUERY, "global_step"])
    assert list(got) == [QUERY, "global_step"]
    with pytest.raises(UserInputError, match="has no tensor bert/pooler/dense/kernel"):
        tf_bundle.read_tensors(google_v1, [QUERY, "bert/pooler/dense/kernel"])


def test_v1_saver_sharded_over_two_devices(tf, sharded_v1):
    assert len(list(Path(sharded_v1).parent.glob("model.ckpt-3.data-*"))) >= 2
    names = [n for n in tf_bundle.list_tensors(sharded_v1) if n != PARTITIONED]
    assert_same_as_tensorflow(tf, sharded_v1, names)


def test_a_partitioned_variable_is_listed_and_refused(tf, sharded_v1):
    shape = tf.train.load_checkpoint(sharded_v1).get_variable_to_shape_map()[PARTITIONED]
    assert tf_bundle.list_tensors(sharded_v1)[PARTITIONED] == (np.dtype(np.float32), tuple(shape))
    with pytest.raises(UserInputError, match=f"{PARTITIONED} in .* is a partitioned variable saved in 2 slices"):
        tf_bundle.read_tensors(sharded_v1)


def test_tf2_max_shard_size_policy_shards(tf, tmp_path):
    model = tf.Module()  # 64-byte tensors and a 64-byte limit: one shard each, none sliced
    model.a = tf.Variable(np.arange(16, dtype=np.float32).reshape(4, 4))
    model.b = tf.Variable(np.linspace(0, 1, 8))
    model.c = tf.Variable(tf.constant(np.linspace(-4, 4, 32), tf.bfloat16))
    model.d = tf.Variable(np.arange(8, dtype=np.int64) - 4)
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=64)
    prefix = tf.train.Checkpoint(model=model).write(
        str(tmp_path / "ckpt"), options=tf.train.CheckpointOptions(experimental_sharding_callback=policy))
    assert len(list(tmp_path.glob("ckpt.data-*"))) >= 3
    assert_same_as_tensorflow(tf, prefix)


def test_find_bundle_prefix_takes_a_prefix_its_files_or_a_folder(tf, google_v1, tf2_folder, tmp_path):
    data = next(Path(google_v1).parent.glob("bert_model.ckpt.data-*"))
    assert tf_bundle.find_bundle_prefix(google_v1) == google_v1
    assert tf_bundle.find_bundle_prefix(google_v1 + ".index") == google_v1
    assert tf_bundle.find_bundle_prefix(data) == google_v1
    assert tf_bundle.find_bundle_prefix(Path(google_v1).parent) == tf.train.latest_checkpoint(
        str(Path(google_v1).parent)) == google_v1  # the v1 Saver's pointer: an absolute path
    assert tf_bundle.find_bundle_prefix(tf2_folder) == tf.train.latest_checkpoint(str(tf2_folder))
    assert tf_bundle.find_bundle_prefix(tf2_folder).endswith("ckpt-2")  # relative pointer, not sorted first
    assert tf_bundle.read_tensors(tf2_folder).keys() == tf_bundle.read_tensors(f"{tf2_folder}/ckpt-2").keys()
    assert tf_bundle.find_bundle_prefix(tmp_path) is None
    assert tf_bundle.find_bundle_prefix(tmp_path / "nothing") is None


def test_a_folder_without_a_usable_pointer(tf, tf2_folder, tmp_path):
    folder = Path(shutil.copytree(tf2_folder, tmp_path / "copy"))
    (folder / "checkpoint").write_text(f'model_checkpoint_path: "/elsewhere/{folder.name}/ckpt-2"\n')
    assert tf_bundle.find_bundle_prefix(folder) == str(folder / "ckpt-2")  # a moved folder: by base name
    (folder / "checkpoint").write_text('model_checkpoint_path: "ckpt-9"\n')
    assert tf.train.latest_checkpoint(str(folder)) is None
    assert tf_bundle.find_bundle_prefix(folder) == str(folder / "ckpt-1")  # the first *.index, sorted
    (folder / "checkpoint").unlink()
    assert tf_bundle.find_bundle_prefix(folder) == str(folder / "ckpt-1")


def copy_of(prefix: str, tmp_path: Path) -> str:
    folder = shutil.copytree(Path(prefix).parent, tmp_path / "copy")
    return str(Path(folder) / Path(prefix).name)


@pytest.fixture(scope="module")
def single(tf, tmp_path_factory):
    """One tensor in one shard, so a flipped byte in the data file hits it."""
    return save_v1(tf, tmp_path_factory.mktemp("single") / "bert_model.ckpt",
                   {EMBEDDINGS: (np.arange(64, dtype=np.float32).reshape(16, 4), "float32")})


def test_a_flipped_byte_in_a_data_shard_names_the_tensor_and_file(single, tmp_path):
    prefix = copy_of(single, tmp_path)
    data = Path(prefix + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0x10
    data.write_bytes(bytes(raw))
    with pytest.raises(UserInputError, match=f"{EMBEDDINGS} in {data} fails its checksum"):
        tf_bundle.read_tensors(prefix)


def test_a_truncated_data_shard(single, tmp_path):
    prefix = copy_of(single, tmp_path)
    os.truncate(prefix + ".data-00000-of-00001", 200)
    with pytest.raises(UserInputError, match=r"data-00000-of-00001 is truncated: bert/embeddings"):
        tf_bundle.read_tensors(prefix)


def test_a_missing_data_shard(tf, sharded_v1, tmp_path):
    prefix = copy_of(sharded_v1, tmp_path)
    shards = sorted(Path(prefix).parent.glob("model.ckpt-3.data-*"))
    shards[1].unlink()
    names = [n for n in tf_bundle.list_tensors(prefix) if n != PARTITIONED]  # the index alone still lists them
    with pytest.raises(UserInputError, match=f"{shards[1].name} is missing: copy every file of the checkpoint"):
        tf_bundle.read_tensors(prefix, names)


def test_a_truncated_index(single, tmp_path):
    prefix = copy_of(single, tmp_path)
    os.truncate(prefix + ".index", os.path.getsize(prefix + ".index") - 10)
    with pytest.raises(UserInputError, match=r"bert_model.ckpt.index is not a TensorFlow checkpoint index.*truncated"):
        tf_bundle.list_tensors(prefix)


def test_a_flipped_byte_in_the_index(single, tmp_path):
    prefix = copy_of(single, tmp_path)
    raw = bytearray(Path(prefix + ".index").read_bytes())
    raw[3] ^= 0x01
    Path(prefix + ".index").write_bytes(bytes(raw))
    with pytest.raises(UserInputError, match=r"\.index is not a TensorFlow checkpoint index.*fails its checksum"):
        tf_bundle.read_tensors(prefix)


def test_a_file_that_is_not_an_index(tmp_path):
    (tmp_path / "model.ckpt.index").write_text("model_checkpoint_path: 'model.ckpt'\n" * 4)
    with pytest.raises(UserInputError, match="model.ckpt.index is not a TensorFlow checkpoint index"):
        tf_bundle.read_tensors(tmp_path / "model.ckpt")
    with pytest.raises(UserInputError, match="no .*nothing.index"):
        tf_bundle.list_tensors(tmp_path / "nothing")


# A bundle written by hand: the format exactly as tensor_bundle.cc and table_builder.cc lay it out.
# The varints, fields and masked CRC are data/wire.py's, which tests/data/test_wire.py checks against protobuf and TF.
def field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, bytes):
        return length_delimited(number, value)
    return tag(number, VARINT) + varint(value)


def block(items: list[tuple[bytes, bytes]], compression: int = 0) -> bytes:
    body, restarts = b"", []
    for key, value in items:
        restarts.append(len(body))
        body += varint(0) + varint(len(key)) + varint(len(value)) + key + value
    restarts = restarts or [0]
    body += struct.pack(f"<{len(restarts) + 1}I", *restarts, len(restarts))
    return body + bytes([compression]) + struct.pack("<I", masked_crc(body + bytes([compression])))


def write_table(path: Path, items: list[tuple[bytes, bytes]], compression: int = 0) -> None:
    data = block(items, compression)
    meta = block([], compression)
    index = block([(items[-1][0], varint(0) + varint(len(data) - 5))], compression)
    handles = varint(len(data)) + varint(len(meta) - 5) + varint(len(data) + len(meta)) + varint(len(index) - 5)
    path.write_bytes(data + meta + index + handles.ljust(40, b"\0") + struct.pack("<Q", 0xDB4775248B80FB57))


def write_bundle(prefix: Path, tensors: dict[str, tuple[int, np.ndarray]], big_endian: bool, compression=0):
    """tensors: name -> (TF DataType number, the stored values, e.g. uint16 for bfloat16)."""
    data, items = b"", []
    for name, (code, array) in sorted(tensors.items()):
        raw = array.astype(array.dtype.newbyteorder(">" if big_endian else "<")).tobytes()
        shape = b"".join(field(2, field(1, d)) for d in array.shape)
        entry = (field(1, code) + field(2, shape) + field(4, len(data)) + field(5, len(raw))
                 + tag(6, FIXED32) + struct.pack("<I", masked_crc(raw)))
        items.append((name.encode(), entry))
        data += raw
    header = field(1, 1) + field(2, int(big_endian)) + field(3, field(1, 1))
    write_table(prefix.with_name(prefix.name + ".index"), [(b"", header)] + items, compression)
    prefix.with_name(prefix.name + ".data-00000-of-00001").write_bytes(data)


def test_a_big_endian_bundle_is_byte_swapped_as_tensorflow_does(tf, tmp_path):
    bf16 = np.array([1.5, -2.0, 3.25], np.float32).view(np.uint32) >> 16
    tensors = {"f32": (1, np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)), "f64": (2, np.array([0.1, -3e300])),
               "i64": (9, np.array([-2, 2**40], np.int64)), "i16": (5, np.array([-300, 7], np.int16)),
               "f16": (19, np.array([0.5, -65504], np.float16)), "bf16": (14, bf16.astype(np.uint16)),
               "bool": (10, np.array([True, False])), "c64": (8, np.array([1 + 2j, -3j], np.complex64))}
    write_bundle(tmp_path / "be.ckpt", tensors, big_endian=True)
    got = assert_same_as_tensorflow(tf, str(tmp_path / "be.ckpt"))
    assert got["bf16"].tolist() == [1.5, -2.0, 3.25] and got["i64"].tolist() == [-2, 2**40]


def test_a_compressed_or_headerless_table_is_refused(tmp_path):
    tensors = {"x": (1, np.ones(3, np.float32))}
    write_bundle(tmp_path / "snappy.ckpt", tensors, big_endian=False, compression=1)
    with pytest.raises(UserInputError, match=r"snappy.ckpt.index is not a TensorFlow .* is compressed \(type 1\)"):
        tf_bundle.list_tensors(tmp_path / "snappy.ckpt")
    write_table(tmp_path / "plain.ckpt.index", [(b"key", b"value")])
    with pytest.raises(UserInputError, match="plain.ckpt.index is not a TensorFlow .*no bundle header"):
        tf_bundle.list_tensors(tmp_path / "plain.ckpt")
    write_bundle(tmp_path / "ok.ckpt", tensors, big_endian=False)  # and the writer above makes a readable one
    assert tf_bundle.read_tensors(tmp_path / "ok.ckpt")["x"].tolist() == [1, 1, 1]


def test_the_reader_imports_neither_tensorflow_nor_protobuf():
    script = ("import sys, tpu_pretrain.models.tf_bundle\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'jax', 'torch')"
              " or m.startswith('google.protobuf')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
