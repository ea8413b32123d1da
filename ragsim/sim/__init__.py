"""Drivers that feed traces through the policy core with modelled (or no) time."""
