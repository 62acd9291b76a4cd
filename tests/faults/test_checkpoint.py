"""Checkpoints: complete or absent, damage noticed, no pickled code run, the model untouched by a refusal.

The adversarial tests play an attacker who can write the checkpoint folder: after tampering they re-seal
``SHA256SUMS`` (``reseal``), so what refuses the file is the loader's own rule, not the checksum. Each
payload would create a marker file if it ran.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import subprocess
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from workbench.train import checkpoint

pytestmark = pytest.mark.timeout(60)


def model_and_opt(seed, width=4):
    torch.manual_seed(seed)
    model = torch.nn.Linear(width, 2 if width == 4 else width)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, width)).sum().backward()
    opt.step()  # momentum buffers: optimizer state worth checking
    return model, opt


def snapshot(model, opt):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {k: v["momentum_buffer"].clone() for k, v in opt.state_dict()["state"].items()})


def assert_same(model, opt, snap):
    torch.testing.assert_close(snapshot(model, opt), snap)


def reseal(folder):
    """What an attacker who can write the folder also does: checksums that match the tampered files."""
    lines = [f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n"
             for f in sorted(folder.iterdir()) if f.is_file() and f.name != "SHA256SUMS"]
    (folder / "SHA256SUMS").write_text("".join(lines))


def data_files(folder):
    return sorted(folder.glob("*.distcp"), key=lambda f: f.stat().st_size)


def refused(tmp_path, model, opt, match="refusing to load", **kwargs):
    """Load must raise one clear sentence, leave the model as it was and run no payload."""
    before = snapshot(model, opt)
    with pytest.raises(ValueError, match=match) as info:
        checkpoint.load(tmp_path / "ck", model=model, optimizer=opt, **kwargs)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    assert not (tmp_path / "MARKER").exists(), "the payload ran"
    assert_same(model, opt, before)
    return message


@pytest.fixture(autouse=True)
def _single_process_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"import pathlib; pathlib.Path({self.marker!r}).write_text('x')",))


def test_round_trip_and_latest_pointer(tmp_path):
    model, opt = model_and_opt(0)
    checkpoint.save(tmp_path, model=model, optimizer=opt, step=20)
    checkpoint.save(tmp_path, model=model, optimizer=opt, step=30)
    assert checkpoint.latest(tmp_path).name == "step-000030"
    other, other_opt = model_and_opt(1)
    assert checkpoint.load(tmp_path, model=other, optimizer=other_opt) == 30
    assert_same(other, other_opt, snapshot(model, opt))
    assert other_opt.param_groups[0]["momentum"] == 0.9


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    model, _ = model_and_opt(0)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        checkpoint.load(tmp_path, model=model)


def test_incomplete_save_leaves_previous_latest(tmp_path):
    model, opt = model_and_opt(0)
    checkpoint.save(tmp_path, model=model, optimizer=opt, step=20)
    (tmp_path / "step-000030").mkdir()  # a save that died half-way: no pointer moved
    (tmp_path / "step-000030" / "__0_0.distcp").write_bytes(b"partial")
    assert checkpoint.latest(tmp_path).name == "step-000020"


def test_checksums_are_recorded_for_every_file(tmp_path):
    model, opt = model_and_opt(0)
    folder = checkpoint.save(tmp_path, model=model, optimizer=opt, step=5)
    sums = dict(reversed(line.split("  ")) for line in (folder / "SHA256SUMS").read_text().splitlines())
    assert ".metadata" in sums and any(name.endswith(".distcp") for name in sums)
    for name, digest in sums.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
    subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=folder, check=True, timeout=30)


@pytest.mark.parametrize("metadata", [b"\x80\x04truncated", "pickle"])
def test_truncated_or_foreign_metadata_is_refused_and_model_unchanged(tmp_path, metadata):
    model, opt = model_and_opt(0)
    checkpoint.save(tmp_path / "ck", model=model, optimizer=opt, step=5)
    folder = tmp_path / "ck" / "step-000005"
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(tmp_path / "MARKER"))
                                       if metadata == "pickle" else metadata)
    reseal(folder)
    refused(tmp_path, *model_and_opt(1))


def short_unicode(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data


@pytest.mark.parametrize("module, name", [("torch.distributed.checkpoint.filesystem", "os.system"),
                                          ("torch.distributed.checkpoint.metadata", "os.system"),
                                          ("torch", "serialization.os.system")])
def test_dotted_name_gadget_in_metadata_is_refused(tmp_path, module, name):
    """(a module DCP metadata uses, "os.system"): pickle resolves the dotted name through its globals."""
    model, opt = model_and_opt(0)
    checkpoint.save(tmp_path / "ck", model=model, optimizer=opt, step=5)
    folder = tmp_path / "ck" / "step-000005"
    gadget = (b"\x80\x04" + short_unicode(module) + short_unicode(name) + b"\x93"  # STACK_GLOBAL
              + short_unicode(f"touch {tmp_path / 'MARKER'}") + b"\x85R.")  # TUPLE1 REDUCE STOP
    (folder / ".metadata").write_bytes(gadget)
    reseal(folder)
    message = refused(tmp_path, *model_and_opt(1))
    assert "os.system" in message


def test_reduce_payload_in_a_non_tensor_item_is_refused(tmp_path):
    """A checkpoint written by plain DCP with a pickled object where a plain value (the lr) belongs."""
    model, opt = model_and_opt(0)
    checkpoint.save(tmp_path / "ck", model=model, optimizer=opt, step=5)
    folder = tmp_path / "ck" / "step-000005"
    for f in folder.iterdir():
        f.unlink()
    optim_sd = opt.state_dict()
    state = {"model": model.state_dict(), "step": torch.tensor(5),
             "optimizer": {"state": {name: optim_sd["state"][i] for i, name in enumerate(["weight", "bias"])},
                           "param_groups": [{**optim_sd["param_groups"][0], "params": ["weight", "bias"],
                                             "lr": Payload(tmp_path / "MARKER")}]}}
    dcp.save(state, checkpoint_id=folder)
    reseal(folder)
    assert not (tmp_path / "MARKER").exists()
    refused(tmp_path, *model_and_opt(1))


def test_crafted_data_file_is_refused(tmp_path):
    """A .distcp holding a torch.save'd payload instead of tensors (metadata and sums made to match)."""
    model, opt = model_and_opt(0)
    checkpoint.save(tmp_path / "ck", model=model, optimizer=opt, step=5)
    folder = tmp_path / "ck" / "step-000005"
    target = data_files(folder)[-1]
    buffer = io.BytesIO()
    torch.save(Payload(tmp_path / "MARKER"), buffer)
    target.write_bytes(buffer.getvalue())
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # the test's own file: trusted here
    for info in metadata.storage_data.values():
        if info.relative_path == target.name:
            info.offset, info.length = 0, len(buffer.getvalue())
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    reseal(folder)
    message = refused(tmp_path, *model_and_opt(1))
    assert target.name in message


def two_checkpoints(tmp_path, width=4):
    """step 5 (returned as a snapshot) and step 10 in tmp_path/ck; the model holds step 10's state."""
    model, opt = model_and_opt(0, width)
    checkpoint.save(tmp_path / "ck", model=model, optimizer=opt, step=5)
    at_5 = snapshot(model, opt)
    model(torch.randn(3, width)).sum().backward()
    opt.step()
    checkpoint.save(tmp_path / "ck", model=model, optimizer=opt, step=10)
    return tmp_path / "ck" / "step-000010", at_5


def test_zeroed_bytes_in_a_data_file_are_noticed(tmp_path):
    folder, _ = two_checkpoints(tmp_path, width=64)  # 16 KiB of weights: the zeros land in tensor data
    target = data_files(folder)[-1]
    data = bytearray(target.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)
    target.write_bytes(bytes(data))
    message = refused(tmp_path, *model_and_opt(1, 64), match="damaged")
    assert f"step-000010/{target.name}" in message


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_truncated_or_deleted_data_file_is_one_sentence_and_fallback_loads_the_previous(tmp_path, damage):
    folder, at_5 = two_checkpoints(tmp_path)
    target = data_files(folder)[-1]
    if damage == "truncated":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target.unlink()
    model, opt = model_and_opt(1)
    message = refused(tmp_path, model, opt, match="refusing to load")
    assert f"step-000010/{target.name}" in message
    with pytest.warns(UserWarning, match="step-000005") as caught:
        assert checkpoint.load(tmp_path / "ck", model=model, optimizer=opt, fallback=True) == 5
    assert target.name in str(caught[0].message)
    assert_same(model, opt, at_5)


def test_a_tampered_latest_pointer_is_refused(tmp_path):
    two_checkpoints(tmp_path)
    (tmp_path / "ck" / "latest").write_text("../../etc")
    refused(tmp_path, *model_and_opt(1), match="latest.*names '../../etc'")


def test_only_the_last_checkpoints_are_kept(tmp_path):
    model, opt = model_and_opt(0)
    (tmp_path / ".step-000007.partial").mkdir()  # left by a save that died
    for step in range(1, 6):
        checkpoint.save(tmp_path, model=model, optimizer=opt, step=step, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000003", "step-000004",
                                                           "step-000005"]
    with pytest.raises(ValueError, match="keep"):
        checkpoint.save(tmp_path, model=model, optimizer=opt, step=6, keep=0)


def test_saving_the_same_step_again_replaces_it(tmp_path):
    model, opt = model_and_opt(0)
    checkpoint.save(tmp_path, model=model, optimizer=opt, step=5)
    with torch.no_grad():
        model.weight.add_(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. DCP's "overwriting an existing checkpoint"
        checkpoint.save(tmp_path, model=model, optimizer=opt, step=5)
    other, other_opt = model_and_opt(1)
    assert checkpoint.load(tmp_path, model=other, optimizer=other_opt) == 5
    assert_same(other, other_opt, snapshot(model, opt))


def test_a_value_json_cannot_hold_is_refused_at_save(tmp_path):
    model, opt = model_and_opt(0)
    with pytest.raises(ValueError, match="extra.when"):
        checkpoint.save(tmp_path, model=model, optimizer=opt, step=5, extra={"when": object()})
    assert not (tmp_path / "latest").exists()
