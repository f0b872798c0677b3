public enum _PlaceholderTidemarkEmulator {}
