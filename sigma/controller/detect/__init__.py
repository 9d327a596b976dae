"""Detection (pure: rows in, findings out): job watchdog, isolation of the culprit node, and their feature reads."""
