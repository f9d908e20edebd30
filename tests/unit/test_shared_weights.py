"""Engine processes map one copy of a runner's weights (inference/shared_weights.py) in a directory the server makes
for them (engine/weights_dir.py): what a runner computes does not change, nothing it holds is written to the file,
and anything amiss leaves a runner its own copy."""
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt_serve.engine import weights_dir
from nmt_serve.inference import shared_weights
from nmt_serve.inference.shared_weights import MIN_BYTES, runner_tensors, share_weights
from nmt_serve.inference.translator import Translator
from tests.conftest import make_checkpoint

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/<pid>/maps")
SOURCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest."]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, spm_model) -> Path:
    """Big enough that some of its storages are worth sharing (MIN_BYTES) and some are not."""
    return make_checkpoint(tmp_path_factory.mktemp("shared") / "de-en", spm_model, "de", "en", seed=5, d_model=64, d_ff=256)


def mapped_ranges(path: Path, pid: int | str = "self") -> list[tuple[int, int]]:
    ranges = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if line.removesuffix(" (deleted)").endswith(str(path)):  # a file unlinked while mapped
            start, end = line.split()[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def big_tensors(translator: Translator) -> list[torch.Tensor]:
    return [t for t in runner_tensors(translator.runner)
            if t.layout == torch.strided and not t.is_mkldnn and t.untyped_storage().nbytes() >= MIN_BYTES]


def load(checkpoint: Path) -> Translator:
    return Translator.load(checkpoint, device="cpu", dtype="float32")


def texts(translator: Translator, beam: int) -> list[str]:
    return [h.text for h in translator.translate(SOURCES, beam_size=beam, max_length=12)]


def test_two_runners_map_one_file_and_compute_what_they_did(checkpoint, tmp_path):
    alone = load(checkpoint)
    expected = {beam: texts(alone, beam) for beam in (1, 4)}
    first, second = load(checkpoint), load(checkpoint)
    runner = first.runner
    assert runner.shared_weights is None
    shared = [share_weights(t.runner, tmp_path, "de-en") for t in (first, second)]
    assert shared[0] is not None and shared[0] == shared[1] and runner.shared_weights == shared[0]  # /v1/models says it
    assert [p.name for p in tmp_path.iterdir()] == [shared[0].path.name]  # no partial file left
    assert shared[0].shared_bytes > 0 and shared[0].private_bytes > 0  # the model's norms stay private
    assert first.runner is runner and runner.is_current()  # not rebuilt: the tensors moved, not their values
    ranges = mapped_ranges(shared[0].path)
    for translator in (first, second):
        tensors = big_tensors(translator)
        assert tensors and all(any(a <= t.data_ptr() < b for a, b in ranges) for t in tensors)
        assert {beam: texts(translator, beam) for beam in (1, 4)} == expected
    # the views of one storage still view one storage: the model's weights are the runner's tensors
    model_weight = first.model.decoder_layers[0].ffn.fc1.weight
    assert any(a <= model_weight.data_ptr() < b for a, b in ranges)
    if runner.row_step is not None:  # the whole step's kernel reads the tensors where they are now
        held = [t for row in runner.row_step.held for t in row]
        assert runner.row_step.table.flatten().tolist() == [t.data_ptr() for t in held]
        assert any(any(a <= t.data_ptr() < b for a, b in ranges) for t in held)
        ends = runner.row_step.held_ends  # the embedding and the output layer
        assert runner.row_step.ends.tolist() == [t.data_ptr() if isinstance(t, torch.Tensor) else t for t in ends]
        assert any(isinstance(t, torch.Tensor) and any(a <= t.data_ptr() < b for a, b in ranges) for t in ends)


def test_a_write_stays_in_its_process_copy(checkpoint, tmp_path):
    first, second = load(checkpoint), load(checkpoint)
    shared = share_weights(first.runner, tmp_path, "de-en")
    share_weights(second.runner, tmp_path, "de-en")
    on_disk = shared.path.read_bytes()
    a, b = big_tensors(first)[0], big_tensors(second)[0]
    before = b.clone()
    with torch.no_grad():
        a.add_(1.0)  # the mapping is private: the page is copied, the file and the other runner keep theirs
    assert torch.equal(b, before) and not torch.equal(a, before)
    assert shared.path.read_bytes() == on_disk


def test_a_file_of_other_bytes_is_not_used(checkpoint, tmp_path):
    first, second = load(checkpoint), load(checkpoint)
    expected = texts(first, 4)
    shared = share_weights(first.runner, tmp_path, "de-en")
    data = bytearray(shared.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shared.path.unlink()
    shared.path.write_bytes(bytes(data))  # the first runner keeps the file it mapped (unlinked, still mapped)
    ptrs = [t.data_ptr() for t in big_tensors(second)]
    assert share_weights(second.runner, tmp_path, "de-en") is None
    assert [t.data_ptr() for t in big_tensors(second)] == ptrs
    assert texts(second, 4) == expected and texts(first, 4) == expected


def test_an_empty_file_under_the_name_is_not_used(checkpoint, tmp_path):
    first, second = load(checkpoint), load(checkpoint)
    path = share_weights(first.runner, tmp_path, "de-en").path
    path.unlink()
    path.touch()
    assert share_weights(second.runner, tmp_path, "de-en") is None
    assert texts(second, 1) == texts(first, 1)


def test_a_published_file_is_mapped_not_written_again(checkpoint, tmp_path):
    first, second = load(checkpoint), load(checkpoint)
    path = share_weights(first.runner, tmp_path, "de-en").path
    inode = path.stat().st_ino
    assert share_weights(second.runner, tmp_path, "de-en").path == path
    assert path.stat().st_ino == inode


def test_a_new_version_removes_the_old_ones_file_and_its_mappings_keep_working(checkpoint, tmp_path):
    old, new, other = load(checkpoint), load(checkpoint), load(checkpoint)
    expected = texts(old, 4)
    old_path = share_weights(old.runner, tmp_path, "de-en", "100-1").path
    other_path = share_weights(other.runner, tmp_path, "de-en-big", "100-1").path  # another model, its id a prefix
    dotted = share_weights(load(checkpoint).runner, tmp_path, "de.en", "300-3").path  # "." is no "_": two models, two names
    assert share_weights(load(checkpoint).runner, tmp_path, "de_en", "400-4").path.exists() and dotted.exists()
    dotted.unlink()
    next(tmp_path.glob("de_en.*")).unlink()
    unchanged = share_weights(load(checkpoint).runner, tmp_path, "de-en", "100-1").path  # the same version: mapped
    assert unchanged == old_path and old_path.exists()
    new_path = share_weights(new.runner, tmp_path, "de-en", "200-2").path
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([new_path.name, other_path.name])
    assert mapped_ranges(old_path) and texts(old, 4) == expected  # unlinked, still mapped by the runner on it


def test_no_room_leaves_each_runner_its_own_copy(checkpoint, tmp_path, monkeypatch):
    translator = load(checkpoint)
    expected = texts(translator, 1)

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shared_weights.os, "link", full)
    ptrs = [t.data_ptr() for t in big_tensors(translator)]
    assert share_weights(translator.runner, tmp_path, "de-en") is None
    assert list(tmp_path.iterdir()) == []  # the partial file is gone
    assert [t.data_ptr() for t in big_tensors(translator)] == ptrs and texts(translator, 1) == expected


def test_a_model_too_small_shares_nothing(spm_model, tmp_path):
    small = make_checkpoint(tmp_path / "model" / "de-en", spm_model, "de", "en", seed=5, d_model=16, n_heads=2, d_ff=32)
    translator = load(small)
    assert not big_tensors(translator)
    shared = tmp_path / "shared"
    shared.mkdir()
    assert share_weights(translator.runner, shared, "de-en") is None and list(shared.iterdir()) == []


def test_the_directory_is_made_for_several_cpu_engines_only_and_orphans_go(tmp_path, monkeypatch):
    monkeypatch.setattr(weights_dir, "SHARED_MEMORY", tmp_path)
    assert weights_dir.make_weights_dir(1, "cpu") == ""
    assert weights_dir.make_weights_dir(2, "cuda") == ""
    assert weights_dir.make_weights_dir(2, "cpu", enabled=False) == ""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    orphan = tmp_path / f"{weights_dir.PREFIX}{gone.stdout.strip()}-abc"
    orphan.mkdir()
    (orphan / "x.weights").write_bytes(b"\0")
    living = tmp_path / f"{weights_dir.PREFIX}{os.getppid()}-def"  # the test runner's parent: alive
    living.mkdir()
    made = weights_dir.make_weights_dir(2, "auto")
    assert Path(made).parent == tmp_path and Path(made).name.startswith(f"{weights_dir.PREFIX}{os.getpid()}-")
    assert not orphan.exists() and living.exists()
    assert oct(Path(made).stat().st_mode & 0o777) == "0o700"
    weights_dir.remove_weights_dir(made)
    assert not Path(made).exists()


def test_the_own_copy_goes_back_to_the_kernel_once_shared(checkpoint, tmp_path, monkeypatch):
    released = []
    monkeypatch.setattr(shared_weights, "release_freed_memory", lambda: released.append(True))
    assert share_weights(load(checkpoint).runner, tmp_path, "de-en") is not None
    assert released == [True]
    small = tmp_path / "other"
    small.mkdir()
    monkeypatch.setattr(shared_weights, "MIN_BYTES", 1 << 40)  # nothing worth sharing: nothing freed
    assert share_weights(load(checkpoint).runner, small, "de-en") is None
    assert released == [True]


def test_no_directory_for_the_weights_leaves_the_engines_a_copy_each(tmp_path, monkeypatch):
    monkeypatch.setattr(weights_dir, "SHARED_MEMORY", tmp_path)

    def full(**_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(weights_dir.tempfile, "mkdtemp", full)
    assert weights_dir.make_weights_dir(2, "cpu") == ""
