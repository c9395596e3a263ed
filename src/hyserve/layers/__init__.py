"""Building blocks whose weights the loader fills; quantised or parallel variants live here, not in the model."""

from hyserve.layers.linear import Linear
from hyserve.layers.lm_head import LMHead
from hyserve.layers.sources import WeightSource, get_sources, resolve_key, set_sources

__all__ = ["LMHead", "Linear", "WeightSource", "get_sources", "resolve_key", "set_sources"]
