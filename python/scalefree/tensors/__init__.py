"""Zero-copy tensor transfer between ranks (:mod:`.slots`: static slots and dynamic
channels) and the parameter server built on it (:mod:`.ps`)."""

from .slots import (DynamicChannel, StaticSlot, aio, dynamic_channels, empty, place, static_slots,
                    traced_allocation_sites, traced_sites)

__all__ = ["DynamicChannel", "StaticSlot", "aio", "dynamic_channels", "empty", "place", "static_slots",
           "traced_allocation_sites", "traced_sites"]
