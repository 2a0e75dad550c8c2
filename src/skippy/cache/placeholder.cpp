// The cache core lands in the next commit.
