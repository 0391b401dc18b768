# metrale._sizing._hf_tables: the tables from_hf_config reads (private data; no public names).
