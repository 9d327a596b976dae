"""Plain-language questions answered from the controller's database with read-only SQL (`sigma ask`)."""
