"""The names of the WAN benchmark's five parts (shared by its command line and its config, import-free)."""

PART_NAMES = ("deliver", "streams", "cut_through", "relay", "e2e")
