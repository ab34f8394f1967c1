"""Where the tests find the repository and their own model files (never outside the clone)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The 12 architectures of ncnn's benchmark set (params only; weights are written at random).
MODELS_DIR = REPO / "tests" / "data" / "models"
#: Models exported with pnnx (no input shapes; pnnx's Reshape expressions).
PNNX_DIR = MODELS_DIR / "pnnx"
#: The example model shipped inside the package.
DIGITS = REPO / "vkserve" / "examples" / "digits"
