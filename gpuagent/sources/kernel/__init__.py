"""The kernel's records: the journal, Xids and SXids, their catalog, clears, earlier boots."""
