"""Aurora's benchmarks: tools above the library, each printing one JSON object (``python -m benchmarks``)."""
