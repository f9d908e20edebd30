"""Command-line tools and their shared handling of options and errors."""
