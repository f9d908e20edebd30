"""The admission rate kept for the engine that replaces this one: read back whole or not at all, written when it moved."""
import json

from nmt_serve.engine.remembered_rate import FILE, SAVE_INTERVAL_S, RateKeeper, RememberedRate


def test_kept_and_read_back(tmp_path):
    assert RememberedRate.load(tmp_path) is None  # a new service: calibrate
    RememberedRate(1234.5, 1.1).save(tmp_path)
    assert RememberedRate.load(tmp_path) == RememberedRate(1234.5, 1.1)
    assert [p.name for p in tmp_path.iterdir()] == [FILE]  # the partial file was renamed, not left


def test_a_file_that_cannot_be_read_means_calibrating(tmp_path, caplog):
    for text in ("{", json.dumps({"rate": 5.0}), json.dumps({"rate": "fast", "output_ratio": 1.0}),
                 json.dumps({"rate": 0.0, "output_ratio": 1.0}), json.dumps([1, 2])):
        (tmp_path / FILE).write_text(text)
        assert RememberedRate.load(tmp_path) is None, text
    assert "could not be read" in caplog.text


def test_the_keeper_writes_when_the_rate_moved_and_at_most_every_interval(tmp_path):
    keep = RateKeeper(tmp_path)
    keep(1000.0, 1.0, now=0.0)
    assert RememberedRate.load(tmp_path) == RememberedRate(1000.0, 1.0)  # at once, the first time
    keep(2000.0, 1.0, now=SAVE_INTERVAL_S / 2)
    assert RememberedRate.load(tmp_path).rate == 1000.0  # not within the interval
    keep(1010.0, 1.0, now=SAVE_INTERVAL_S)
    assert RememberedRate.load(tmp_path).rate == 1000.0  # moved by 1%: not worth a write
    keep(1100.0, 1.0, now=2 * SAVE_INTERVAL_S)
    assert RememberedRate.load(tmp_path).rate == 1100.0
    keep(1100.0, 1.5, now=3 * SAVE_INTERVAL_S)
    assert RememberedRate.load(tmp_path) == RememberedRate(1100.0, 1.5)  # the output ratio moved
    remembered = RateKeeper(tmp_path, RememberedRate.load(tmp_path))
    (tmp_path / FILE).unlink()
    remembered(1100.0, 1.5, now=0.0)
    assert not (tmp_path / FILE).exists()  # what the engine started from is not written again
