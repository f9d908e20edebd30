"""Text processing shared by the API and the CLI: sentences, HTML, word alignment, language detection, quality flags."""
