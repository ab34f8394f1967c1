# Issues 3 and 5 on the GPU machine: the mode test (all precisions), pipeline-cache cold vs
# warm, and the Vulkan engine vs ncnn per model. Model .param files come from tests/data/models.
. benchmarks/gpu_env.sh
python3 -m vkserve devices
python3 -m pytest -q -p no:cacheprovider tests/test_glsl_modes.py -rA 2>&1 | grep -E "PASSED|FAILED|passed|failed"
python3 benchmarks/pipeline_cache_cold_warm.py --runs 3 --json "$OUT/cold_warm.json"
python3 benchmarks/vulkan_vs_ncnn.py --models tests/data/models --repeat 20 --json "$OUT/vulkan_vs_ncnn.json" "$@" 2>&1 | tee "$OUT/vulkan_vs_ncnn.log"
