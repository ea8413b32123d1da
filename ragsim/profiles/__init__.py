"""Cost side of ragsim: model architectures, prefill-cost tables and their interpolation."""
