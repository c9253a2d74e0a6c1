"""Index operators (IntIndexCreate, StringIndexCreate, IndexGet, IndexLoad, IndexStore, IndexFreeze, IndexSize)."""
