"""A parallel corpus from Debian's translations, built reproducibly through apt (`nmt-corpus`).

Sources, fetched by package name through apt in a private apt tree (apt.py):
- package descriptions (ddtp.py): the releases' i18n/Translation-{en,de,fr,cs}, paired by
  Description-md5; short descriptions and long ones (paragraphs, list items);
- message catalogs (catalogs.py) of a fixed list of packages (package_list.py): .mo files, msgid ->
  msgstr, read with polib;
- example sentences of bilingual dictionaries (dictionary.py): Ding's German-English list
  (trans-de-en), everyday language;
- translated help (help_pages.py): the Mallard pages of GNOME's guides and of a fixed list of
  applications and games, paired block by block (paragraphs, titles, summaries), running prose.
Units are cut into sentence pairs where the sentence counts agree (alignment.py), cleaned and
filtered (markup.py, filters.py: every rule and what it dropped go into the manifest), and split by
package into training and held-out evaluation data (heldout.py: SHA-1 of the name ends in 0; for a
dictionary, of the entry's text; for help, of the page's name). A package's files are read without
installing it (deb_files.py).

Layout of a corpus directory (default corpora/debian-v3/, git-ignored; debian-v1 is the same build
without dictionary sentences and help pages, `--help-packages '' --dictionaries ''`; debian-v2, which had
dictionary sentences, was built by builder version 2, which dropped those with optional words):

    train.{x}-{y}.{x}, train.{x}-{y}.{y}   line-aligned training pairs, plain UTF-8, one segment a line,
                                           for every pair of the languages: en-de, en-fr, en-cs, de-fr, de-cs, fr-cs
    train.{x}-{y}.origin                   per line: kind (ddtp-short, ddtp-long, catalog, dictionary, help), package,
                                           release
    eval.{x}-{y}.*                         the same for the held-out packages, dictionary entries and help pages
    eval-short.{x}-{y}.*                   held-out short descriptions only (the package descriptions' test set)
    eval-dictionary.{x}-{y}.*              held-out dictionary sentences only (everyday sentences' test set)
    eval-help.{x}-{y}.*                    held-out help pages' sentences only (running prose's test set)
    manifest.json                          sources (releases and their dates, files, packages, versions,
                                           licenses), rules and their drops, counts, each file's lines and SHA-256

Training reads a pair like any other parallel text: `--train-src corpora/debian-v1/train.en-de.de
--train-tgt corpora/debian-v1/train.en-de.en`. Pairs other than with English come from translations of
the same English text (same description digest, same catalog message).
"""
