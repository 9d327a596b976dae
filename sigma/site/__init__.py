"""A site's deployment: `sigma site init` writes its configs, units, keys and node bundles from a few answers;
`sigma site check` says what a host still lacks (docs/deploy.md)."""
