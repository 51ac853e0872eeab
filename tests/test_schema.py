import copy
import json

import jsonschema
import pytest

from samu import paths, schema


@pytest.fixture
def seed():
    with open(paths.SEED_FILE) as f:
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
