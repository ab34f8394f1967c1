"""`vkserve layers`: what the engines really run, and the README's table generated from it."""

from __future__ import annotations

import json
import re
import subprocess

from tests.support.daemon import vkserve_cmd
from tests.support.paths import REPO
from vkserve.cli.commands.layers import engines_by_type, markdown
from vkserve.devices.cpu.kernels import REGISTRY
from vkserve.devices.vulkan.engine.plan import supported_layer_types
from vkserve.models.layers import LAYER_TYPES

README_BLOCK = re.compile(r"<!-- layers: vkserve layers --markdown -->\n(.*?)\n<!-- /layers -->", re.S)


def test_json_lists_every_parsed_type_with_the_engines_that_register_it() -> None:
    p = subprocess.run(vkserve_cmd("layers", "--json"), cwd=REPO, capture_output=True, text=True,
                       timeout=120, check=True)
    table = json.loads(p.stdout)
    assert set(table) == set(LAYER_TYPES)
    for layer_type, engines in table.items():
        assert ("cpu" in engines) == (layer_type in REGISTRY), layer_type
        assert ("vulkan" in engines) == (layer_type in supported_layer_types()), layer_type
    assert table["Convolution"] == ["cpu", "vulkan"] and table["Input"] == ["cpu", "vulkan"]


def test_readme_table_is_the_command_output() -> None:
    found = README_BLOCK.search((REPO / "README.md").read_text())
    assert found, "README.md has no <!-- layers: vkserve layers --markdown --> block"
    assert found.group(1) == markdown(engines_by_type()), (
        "README's layer table is stale: regenerate it with `vkserve layers --markdown`")
