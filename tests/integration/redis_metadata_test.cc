// The Redis store's own tests (placeholder until the store lands).
