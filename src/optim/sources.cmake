# Sources of the optim layer (owned by that layer; keeps merges of parallel work apart).
