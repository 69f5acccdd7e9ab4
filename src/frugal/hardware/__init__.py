"""GPU specs and (later) offer catalogs: dated, sourced data files."""
