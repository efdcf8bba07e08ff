"""salt/pillar.example as a user copies it: every snapshot schedule it shows
passes the module's own checks, and its keys are the ones the formulas
read. The volumes are checked by the node's own parser in Go
(internal/spec TestPillarExampleVolumesAreValid)."""
import importlib.util
import os

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "pillar.example")


def load_module():
    path = os.path.join(HERE, "..", "_modules", "salt_volumes.py")
    spec = importlib.util.spec_from_file_location("salt_volumes_pillar_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def example():
    with open(EXAMPLE) as f:
        return yaml.safe_load(f)["salt_volumes"]


def test_schedules_pass_the_modules_checks():
    mod = load_module()
    schedules = example()["snapshot_schedules"]
    assert schedules
    for name, conf in schedules.items():
        checked = mod._check_schedule(name, conf)
        assert checked["keep"] == conf["keep"]


def test_keys_are_the_ones_the_formulas_read():
    states = os.path.join(HERE, "..", "states", "salt_volumes")
    read = ""
    for root, _, names in os.walk(states):
        for name in names:
            if name.endswith((".sls", ".jinja")):
                with open(os.path.join(root, name)) as f:
                    read += f.read()
    for kind in ("_modules", "_beacons"):
        with open(os.path.join(HERE, "..", kind, "salt_volumes.py")) as f:
            read += f.read()
    for key in example():
        assert "salt_volumes:" + key in read, "pillar.example shows salt_volumes:{}, which nothing reads".format(key)
