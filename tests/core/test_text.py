import numpy as np
import pytest

from dyntc.errors import DyntcError
from dyntc.core.text import PAD, UNK, Vocabulary, build_vocabulary_and_embeddings, glove_lookup, tokenize


def test_tokenize_lowercases_and_splits_punctuation():
    assert tokenize("Flight's LATE!! 2 hrs") == ["flight's", "late", "!", "!", "2", "hrs"]
    assert tokenize("Flight", lower=False) == ["Flight"]
    assert tokenize("   ") == []


def test_vocabulary_min_count_and_unknown():
    vocab = Vocabulary.build([["a", "b", "a"], ["c", "a"]], min_count=2)
    assert vocab.tokens == [PAD, UNK, "a"]
    assert vocab.ids(["a", "zzz"]) == [2, 1]
    assert vocab.ids([]) == [1], "an empty token list must still give one id"
    assert vocab.ids(["a"] * 10, max_len=3) == [2, 2, 2]
    with pytest.raises(DyntcError, match="min_count"):
        Vocabulary.build([["a"]], min_count=0)


def test_packaged_glove_has_known_vectors():
    found, dim = glove_lookup(["the", "airline", "qqqzzzxxy"])
    assert dim == 50 and set(found) == {"the", "airline"}
    assert found["the"].shape == (50,) and np.abs(found["the"]).sum() > 1


def test_vocabulary_keeps_only_words_glove_knows():
    vocab, matrix = build_vocabulary_and_embeddings(["the plane is late", "the qqqzzzxxy plane"])
    assert "qqqzzzxxy" not in vocab.index and "plane" in vocab.index
    assert matrix.shape == (len(vocab), 50)
    assert not matrix[:2].any(), "pad and unk rows are zero"
    found, _ = glove_lookup(["plane"])
    np.testing.assert_array_equal(matrix[vocab.index["plane"]], found["plane"])


def test_glove_text_file_by_path(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("plane 0.1 0.2 0.3\nlate -1 0 1\n")
    vocab, matrix = build_vocabulary_and_embeddings(["plane late again"], embeddings=path)
    assert matrix.shape == (4, 3)
    np.testing.assert_allclose(matrix[vocab.index["late"]], [-1, 0, 1])


def test_bad_embeddings_files(tmp_path):
    with pytest.raises(DyntcError, match="does not exist"):
        build_vocabulary_and_embeddings(["x"], embeddings=tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("plane 0.1 0.2\nlate 1\n")
    with pytest.raises(DyntcError, match="expected 2 numbers"):
        build_vocabulary_and_embeddings(["plane late"], embeddings=bad)


def test_vocabulary_extension_with_a_glove_file_lacking_the_new_words(tmp_path):
    """Adding examples whose new words the custom GloVe file does not know keeps them <unk>
    (it used to raise 'no GloVe vector found', breaking add_label on a typo)."""
    from dyntc.core.encoders.glove_sru import GloveSRUConfig, GloveSRUEncoder

    path = tmp_path / "tiny.txt"
    path.write_text("plane 0.1 0.2 0.3\nlate -1 0 1\nbags 1 1 1\n")
    enc = GloveSRUEncoder.from_texts(["plane late"], GloveSRUConfig(embeddings=str(path), hidden_size=4, num_layers=1))
    assert enc.extend_vocabulary(["plane qwzx"]) == 0
    assert enc.extend_vocabulary(["lost bags qwzx"]) == 1 and "bags" in enc.vocab.index
    with pytest.raises(DyntcError, match="no GloVe vector"):
        glove_lookup(["qwzx"], path)


@pytest.mark.data
def test_glove_subset_rebuilds_the_packaged_vocabulary_bit_for_bit(tmp_path, small_sent):
    from dyntc.core.text import write_glove_subset

    path = tmp_path / "glove-sent.txt"
    written, seen = write_glove_subset(small_sent.train.texts + ["qqqzzzxxy zebra"], path)
    assert 0 < written < seen  # words GloVe does not know (qqqzzzxxy, some handles) are left out
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == written and not any(line.startswith("qqqzzzxxy ") for line in lines)
    assert all(len(line.split(" ")) == 51 for line in lines)
    vocab_pkg, matrix_pkg = build_vocabulary_and_embeddings(small_sent.train.texts)
    vocab_file, matrix_file = build_vocabulary_and_embeddings(small_sent.train.texts, embeddings=path)
    assert vocab_pkg.tokens == vocab_file.tokens
    assert matrix_pkg.dtype == matrix_file.dtype == np.float32
    assert np.array_equal(matrix_pkg, matrix_file)  # shortest round-tripping decimals: not one bit lost
