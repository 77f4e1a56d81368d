"""The wire module writes and reads what protobuf and TensorFlow do, byte for byte: varints and fields against
protobuf's own encoding, records against TensorFlow's TFRecordWriter, the compiled encoder's records and CRC against
``tf.train.Example`` and ``google_crc32c``, the event log against TensorFlow's own event reader."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest

from tpu_pretrain import wire_format as wire
from tpu_pretrain.core.event_log import EventFile, encode_event
from tpu_pretrain.data import example_encoder

INT64S = [0, 1, 127, 128, 300, 16383, 16384, 2**31, 2**35 + 7, 2**63 - 1, -1, -2, -(2**63)]


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def test_varints_and_fields_are_protobufs_own_bytes(tf):
    packed = tf.train.Int64List(value=INT64S).SerializeToString()  # field 1, packed: the varints back to back
    assert packed == wire.length_delimited(1, wire.varints(np.array(INT64S)))
    [(number, wire_type, payload)] = wire.proto_fields(packed)
    assert (number, wire_type) == (1, wire.LENGTH_DELIMITED)
    assert wire.decode_varints(payload).tolist() == INT64S
    pos, read = 0, []
    while pos < len(payload):
        value, pos = wire.read_varint(payload, pos)
        read.append(wire.signed(value))
    assert read == INT64S
    event = tf.compat.v1.Event(wall_time=1.5, step=-3, file_version="brain.Event:2")
    assert encode_event(1.5, -3, file_version="brain.Event:2") == event.SerializeToString()
    fields = [(n, w) for n, w, _ in wire.proto_fields(event.SerializeToString())]
    assert fields == [(1, wire.FIXED64), (2, wire.VARINT), (3, wire.LENGTH_DELIMITED)]


def test_a_cut_varint_or_field_is_a_value_error():
    with pytest.raises(ValueError, match="varint runs past the end"):
        wire.read_varint(b"\x80\x80", 0)
    with pytest.raises(ValueError, match="field 2 runs past the end"):
        list(wire.proto_fields(wire.length_delimited(2, b"abcdef")[:-1]))


def test_records_are_tensorflows_record_writer_bytes(tf, tmp_path):
    records = [b"", b"x", bytes(range(256)) * 5, np.random.default_rng(0).bytes(70_000)]
    with tf.io.TFRecordWriter(str(tmp_path / "tf.tfrecord")) as writer:
        for record in records:
            writer.write(record)
    assert (tmp_path / "tf.tfrecord").read_bytes() == b"".join(map(wire.frame_record, records))
    for record in records:
        assert wire.unmask(wire.masked_crc(record)) == google_crc32c.value(record)


def test_the_compiled_crc_and_encoder_match_google_crc32c_and_tf_example(tf):
    buf = np.frombuffer(np.random.default_rng(1).bytes(64), np.uint8)
    for start in range(9):  # every alignment, the eight-byte steps and the byte-at-a-time tail
        for end in range(start, len(buf) + 1):
            assert example_encoder._masked_crc32c(buf, start, end) == wire.masked_crc(buf[start:end].tobytes())
    batch = {"input_ids": np.array([[5, 2**40, 0], [-7, 1, 300]]), "weights": np.array([[0.5], [-2.25]], np.float32)}
    buffer, offsets = example_encoder.encode_framed(batch)
    expected = []
    for row in range(2):
        example = tf.train.Example(features=tf.train.Features(feature={
            "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=batch["input_ids"][row])),
            "weights": tf.train.Feature(float_list=tf.train.FloatList(value=batch["weights"][row]))}))
        expected.append(wire.frame_record(example.SerializeToString(deterministic=True)))
    assert buffer.tobytes() == b"".join(expected) and offsets.tolist() == [0, len(expected[0]), len(buffer)]


def test_the_event_log_reads_in_tensorflows_event_reader(tf, tmp_path):
    log = EventFile(tmp_path)
    log.write(7, {"loss": 2.5, "lr": 1e-4})
    log.close()
    events = list(tf.compat.v1.train.summary_iterator(str(log.path)))
    assert [e.file_version for e in events] == ["brain.Event:2", ""] and events[1].step == 7
    assert {v.tag: v.simple_value for v in events[1].summary.value} == {"loss": 2.5, "lr": pytest.approx(1e-4)}
