"""Bulk actions on a filter (issue 33, item 1): one operator action on every task a filter
matches, as a durable job (board.models.BulkJob) run in the background, each task one move of the
engine's operator verbs held to the version read. board.bulk.jobs is the whole of it;
docs/bulk.md says what it guarantees."""
