import copy
import json
import os
import stat
import subprocess

import jsonschema
import pytest

from samu import paths
from samu.experiment import schema


@pytest.fixture
def seed():
    with open(paths.PUBLISHED_H800_FILE) as f:
        return json.load(f)


def test_seed_validates_verbatim(seed):
    schema.validate(seed)
    assert len(seed["rows"]) == 8


@pytest.mark.parametrize("path", [("schema_version",), ("protocol", "order"),
                                  ("environment", "gpu"), ("rows", 0, "backward"),
                                  ("rows", 3, "peak_reserved_bytes"),
                                  ("rows", 1, "forward", "median_ms"),
                                  ("rows", 2, "rounds", 1, "order_index")])
def test_missing_key_is_rejected(seed, path):
    doc = copy.deepcopy(seed)
    node = doc
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]
    with pytest.raises(jsonschema.ValidationError):
        schema.validate(doc)


def test_wrong_sample_count_is_rejected(seed):
    doc = copy.deepcopy(seed)
    doc["rows"][0]["forward"]["samples_ms"].pop()
    with pytest.raises(jsonschema.ValidationError):
        schema.validate(doc)
    doc = copy.deepcopy(seed)
    doc["rows"][0]["rounds"][1]["backward_ms"].append(1.0)
    with pytest.raises(jsonschema.ValidationError):
        schema.validate(doc)


def test_atomic_write_leaves_old_file_on_failure(seed, tmp_path):
    path = tmp_path / "out.json"
    schema.write_json_atomic(path, seed)
    before = path.read_text()
    bad = copy.deepcopy(seed)
    del bad["rows"]
    with pytest.raises(jsonschema.ValidationError):
        schema.write_json_atomic(path, bad)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind


def test_non_finite_numbers_stay_valid_json(tmp_path):
    path = schema.write_json_atomic(tmp_path / "c.json", {"x": float("inf")}, kind=None)
    assert json.loads(path.read_text()) == {"x": "inf"}


@pytest.mark.parametrize("mode", [0o644, 0o664, 0o640])
def test_rewrite_keeps_the_file_mode(tmp_path, mode):
    path = schema.write_json_atomic(tmp_path / "c.json", {"x": 1}, kind=None)
    os.chmod(path, mode)
    schema.write_json_atomic(path, {"x": 2}, kind=None)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert json.loads(path.read_text()) == {"x": 2}


def test_new_file_is_world_readable(tmp_path):
    path = schema.write_json_atomic(tmp_path / "new.json", {"x": 1}, kind=None)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_exception_inside_the_write_leaves_old_file_and_no_temporary(tmp_path):
    path = schema.write_json_atomic(tmp_path / "c.json", {"x": 1}, kind=None)
    before = path.read_text()
    seen = []

    def write_half_then_fail(tmp):
        seen.append(tmp)
        tmp.write_text('{"x": ')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        schema.atomic_write(path, write_half_then_fail)
    assert seen and seen[0].parent == path.parent
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]
    with pytest.raises(TypeError):  # json.dump fails part-way through
        schema.write_json_atomic(path, {"a": 1, "b": object()}, kind=None)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_temporaries_and_locks_are_git_ignored(tmp_path):
    from samu import calibration_file
    names = []
    schema.atomic_write(tmp_path / "1x8x16.json", lambda tmp: (names.append(tmp.name),
                                                               tmp.write_text("{}")))
    (temporary,) = names
    assert temporary.startswith(".1x8x16.json.") and temporary.endswith(".tmp")
    data = paths.REPO_ROOT / "data"
    candidates = [data / "results" / "nvidia-h200" / temporary,
                  data / "calibration" / temporary.replace("1x8x16", "nvidia-h200"),
                  data / "figures" / temporary.replace("1x8x16.json", "nvidia-h200_time.png"),
                  calibration_file.lock_path(data / "calibration" / "nvidia-h200.json")]
    relative = [str(p.relative_to(paths.REPO_ROOT)) for p in candidates]
    done = subprocess.run(["git", "check-ignore", "--no-index", *relative],
                          cwd=paths.REPO_ROOT, capture_output=True, text=True)
    assert done.stdout.split() == relative, done.stderr


COMMITTED_SHAPE_FILE = paths.REPO_ROOT / "data" / "results" / "nvidia-h200" / "4x2048x2048.json"


def _single_peer_form(doc: dict) -> dict:
    """A result document as files written before there were several peers hold it: the first
    peer as "peer", its speedup as "speedup_vs_peer" beside it, no "peers"."""
    for row in doc["rows"]:
        peer = dict(row.pop("peers")[schema.SINGLE_PEER])
        row["speedup_vs_peer"] = peer.pop("speedup")
        row["peer"] = peer
    return doc


def test_a_single_peer_file_reads_as_peers(tmp_path):
    """Files written before there were several peers hold one as "peer" with "speedup_vs_peer"
    beside it; read, each row holds it under peers[SINGLE_PEER] with its speedup."""
    path = tmp_path / COMMITTED_SHAPE_FILE.name
    path.write_text(json.dumps(_single_peer_form(schema.read_json(COMMITTED_SHAPE_FILE))))
    raw = schema.read_json(path)
    assert all("peer" in row and "peers" not in row for row in raw["rows"])
    doc = schema.read_valid_json(path)
    for old, new in zip(raw["rows"], doc["rows"]):
        assert "peer" not in new and "speedup_vs_peer" not in new
        assert list(new["peers"]) == [schema.SINGLE_PEER]
        entry = new["peers"][schema.SINGLE_PEER]
        assert entry == {**old["peer"], "speedup": old["speedup_vs_peer"]}
        assert entry["pipeline"].endswith("_then_fla_chunk_hgrn")
        assert {k: v for k, v in new.items() if k != "peers"} == {
            k: v for k, v in old.items() if k not in ("peer", "speedup_vs_peer")}
    assert schema.read_json(path) == raw  # reading rewrites nothing


def test_rows_without_a_peer_stay_without(tmp_path):
    """Rows timed before there was a peer (no "peer", no "peers") are read without one."""
    doc = schema.read_json(COMMITTED_SHAPE_FILE)
    for row in doc["rows"]:
        del row["peers"]
    path = tmp_path / COMMITTED_SHAPE_FILE.name
    path.write_text(json.dumps(doc))
    assert all("peers" not in row for row in schema.read_valid_json(path)["rows"])


@pytest.fixture
def with_a_peer(seed):
    """The published H800 document with the committed H200 peer entry in its first row."""
    entry = schema.read_valid_json(COMMITTED_SHAPE_FILE)["rows"][0]["peers"][schema.SINGLE_PEER]
    doc = copy.deepcopy(seed)
    doc["rows"][0]["peers"] = {"toy": copy.deepcopy(entry)}
    schema.validate(doc)
    return doc


@pytest.mark.parametrize("breakage, words", [
    (lambda peer: peer.pop("speedup"), "'speedup' is a required property"),
    (lambda peer: peer["forward_backward"].pop("median_ms"), "'median_ms' is a required"),
    (lambda peer: peer.update(gpu_time_ms="fast"), "'fast' is not of type"),
    (lambda peer: peer["rounds"].pop(), "is too short"),
], ids=["no speedup", "no median", "a GPU time that is no number", "one round"])
def test_a_malformed_peer_entry_is_refused_naming_it(with_a_peer, tmp_path, breakage, words):
    breakage(with_a_peer["rows"][0]["peers"]["toy"])
    with pytest.raises(jsonschema.ValidationError) as caught:
        schema.validate(with_a_peer)
    assert caught.value.json_path.startswith("$.rows[0].peers.toy"), caught.value.json_path
    path = tmp_path / "1x1x1.json"
    path.write_text(json.dumps(with_a_peer))
    with pytest.raises(schema.ResultFileError) as caught:
        schema.read_valid_json(path)
    message = str(caught.value)
    assert words in message and "$.rows[0].peers.toy" in message, message


def test_a_peer_name_that_cannot_name_a_column_is_refused(with_a_peer):
    peers = with_a_peer["rows"][0]["peers"]
    peers["eager + FLA"] = peers.pop("toy")
    with pytest.raises(jsonschema.ValidationError, match="'eager \\+ FLA' does not match"):
        schema.validate(with_a_peer)
