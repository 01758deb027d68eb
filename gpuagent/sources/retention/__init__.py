"""Whether the journal can hold ``history_days``: the evidence recurrence reads (issue 30)."""
