"""Job apps that tests run as real worker processes (`stream-jobs worker tests.apps.X:app`)."""
