public enum _PlaceholderTidemarkStore {}
