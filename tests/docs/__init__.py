"""The manual runs as written: README.md's and docs/' samples executed on the real stack."""
