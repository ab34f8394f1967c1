"""vkserve: an inference daemon for edge boxes with Vulkan GPUs.

Every part lives under this one namespace (``vkserve.daemon``, ``vkserve.cli``,
``vkserve.scheduler``, ``vkserve.devices``, ``vkserve.cache``, ``vkserve.models``,
``vkserve.client``); see the README's "Layout" section.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vkserve")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
