import gzip

import pytest

from tpu_pretrain.config import CorpusConfig
from tpu_pretrain.data.corpus import CorpusReader, TextNormalizer, split_sentences
from tpu_pretrain.errors import UserInputError


def read_docs(paths, **settings):
    reader = CorpusReader([str(p) for p in paths], CorpusConfig(**settings))
    return list(reader.documents()), reader.stats


def test_blank_lines_and_separator_lines_end_documents(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("one.\ntwo.\n\nthree.\n%\nfour.\n\n\n")
    docs, stats = read_docs([path], doc_separator="%")
    assert docs == [["one.", "two."], ["three."], ["four."]]
    assert stats.documents == 3 and stats.sentences == 4


def test_gzip_folders_and_globs_are_streamed(tmp_path):
    (tmp_path / "sub").mkdir()
    with gzip.open(tmp_path / "sub" / "b.txt.gz", "wt") as handle:
        handle.write("gz line.\n")
    (tmp_path / "a.txt").write_text("plain line.\n")
    (tmp_path / "notes.md").write_text("ignored\n")
    docs, _ = read_docs([tmp_path])
    assert docs == [["plain line."], ["gz line."]]
    docs, _ = read_docs([tmp_path / "**" / "*.gz"])
    assert docs == [["gz line."]]


def test_missing_input_names_it(tmp_path):
    with pytest.raises(UserInputError, match="nope.txt' does not exist"):
        CorpusReader([str(tmp_path / "nope.txt")], CorpusConfig())
    with pytest.raises(UserInputError, match="matches no file"):
        CorpusReader([str(tmp_path / "*.txt")], CorpusConfig())


def test_bad_lines_are_counted_and_located_not_fatal(tmp_path):
    path = tmp_path / "dirty.txt"
    path.write_bytes(b"good line\n\xff\xfe broken bytes\n" + b"x" * 50 + b"\nsame\nsame\n")
    (tmp_path / "empty.txt").write_bytes(b"")
    docs, stats = read_docs([path, tmp_path / "empty.txt"], max_line_length=40, dedupe_lines=True)
    assert docs == [["good line", "broken bytes", "same"]]
    assert stats.undecodable_lines == 1 and stats.examples["undecodable"] == [f"{path}:2"]
    assert stats.too_long_lines == 1 and stats.examples["too_long"] == [f"{path}:3"]
    assert stats.duplicate_lines == 1
    assert stats.empty_files == [str(tmp_path / "empty.txt")]
    report = stats.report()
    assert f"{path}:2" in report and "empty file" in report


def test_normalisation_options():
    config = CorpusConfig()
    normalize = TextNormalizer(config, do_lower_case=True)
    text = normalize("\x1b[1;33mＣａｆé\u200b\tNAÏVE\x07 ﬁle\x1b[0m")
    assert text == "Café NAÏVE file"  # ANSI codes and controls gone, NFKC applied, case kept for splitting
    assert normalize.lower(text) == "cafe naive file"
    no_punct = TextNormalizer(CorpusConfig(strip_punctuation=True))
    assert no_punct("Hello, world! (ok) «quoted» 你好。") == "Hello world ok quoted 你好"
    raw = TextNormalizer(CorpusConfig(unicode_normalization="none", strip_control=False))
    assert raw("Ｃａｆé") == "Ｃａｆé"


def test_sentence_splitting_english_and_chinese():
    assert split_sentences("It rained. Then it stopped! Did it? Yes, e.g. now.") == [
        "It rained.", "Then it stopped!", "Did it?", "Yes, e.g. now."]
    assert split_sentences("今天下雨了。明天呢？“好的！”他说。") == ["今天下雨了。", "明天呢？", "“好的！”", "他说。"]


def test_reservoir_sample_is_bounded_and_reproducible(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    reader = CorpusReader([str(path)], CorpusConfig())
    first = reader.sample_lines(50, seed=1)
    assert len(first) == 50 and len(set(first)) == 50
    assert CorpusReader([str(path)], CorpusConfig()).sample_lines(50, seed=1) == first


# -- files that are not what their names say, through the command line ---------------------------------------
FRENCH = ["Le château élève ses tours près de la rivière.", "Où êtes-vous allés cet été ?",
          "La forêt était très calme à l'aube.", "Nous avons mangé des crêpes à Noël."] * 20


def vocab_cli(inputs, out, *extra):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tpu_pretrain", "vocab", "--input", *map(str, inputs),
                           "--output_dir", str(out), "--vocab_size", "400", "--num_unused_tokens", "0", *extra],
                          capture_output=True, text=True, timeout=120)


def test_compression_is_recognised_by_content_and_what_is_not_text_is_refused(tmp_path):
    import bz2
    import io
    import shutil
    import tarfile

    upper = tmp_path / "CORPUS.TXT.GZ"
    upper.write_bytes(gzip.compress(b"a gzip file with an upper-case name.\n"))
    misnamed = tmp_path / "plain.txt"
    misnamed.write_bytes(bz2.compress(b"bzip2 content in a .txt file.\n"))
    docs, stats = read_docs([upper, misnamed])
    assert docs == [["a gzip file with an upper-case name."], ["bzip2 content in a .txt file."]]
    assert stats.undecodable_lines == 0

    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        info = tarfile.TarInfo("inner.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"hello\n"))
    (tmp_path / "corpus.tar.gz").write_bytes(archive.getvalue())
    shutil.copyfile(shutil.which("ls") or "/bin/ls", tmp_path / "ls")
    (tmp_path / "french.txt").write_bytes("\n".join(FRENCH).encode("latin-1"))
    for name, says in (("corpus.tar.gz", "is a tar archive: extract it (tar xf"), ("ls", "program (ELF binary)"),
                       ("french.txt", "are not valid utf-8 text. If it is text in another encoding, say which with "
                                      "--encoding")):
        done = vocab_cli([tmp_path / name], tmp_path / "out")
        assert done.returncode == 2, done.stderr
        assert f"Corpus file {tmp_path / name}" in done.stderr and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
    # Told the encoding, the accents survive (do_lower_case strips them later only if asked).
    docs, stats = read_docs([tmp_path / "french.txt"], encoding="latin-1")
    assert docs[0][:2] == FRENCH[:2] and stats.undecodable_lines == 0
    done = vocab_cli([tmp_path / "french.txt"], tmp_path / "out", "--encoding", "latin-1", "--do_lower_case=false")
    assert done.returncode == 0, done.stderr
    assert "château" in (tmp_path / "out" / "vocab.txt").read_text(encoding="utf-8")


def test_a_damaged_gzip_names_the_file_and_the_line(tmp_path):
    lines = [f"line number {i} of a compressed corpus with some words." for i in range(5000)]
    packed = gzip.compress("\n".join(lines).encode())
    damaged = tmp_path / "damaged.txt.gz"
    damaged.write_bytes(packed[: len(packed) // 2])
    done = vocab_cli([damaged], tmp_path / "out")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"Corpus file {damaged} is damaged after line " in done.stderr
