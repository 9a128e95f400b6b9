"""Support code the tests share: the OTLP receiver, torchrun jobs, recorded data, fixtures."""
