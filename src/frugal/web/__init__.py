"""The dashboard: a local web app and its JSON API over the ledger (`frugal dashboard`)."""
