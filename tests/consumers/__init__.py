"""Reference consumers of the placement-hint exports; they read only the documents."""
