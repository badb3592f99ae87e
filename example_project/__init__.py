"""The demo shop (grows with the sharding issue); ``python -m example_project`` runs it."""
