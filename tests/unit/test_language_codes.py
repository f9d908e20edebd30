"""The ISO 639-3 names kept beside the code are lingua's, and naming a model's languages needs no lingua."""
import subprocess
import sys

from nmt_serve.text.language_codes import ISO_639_3, iso_639_1, iso_aliases, public_names


def test_table_is_linguas():
    from lingua import Language

    assert ISO_639_3 == {lang.iso_code_639_3.name.lower(): lang.iso_code_639_1.name.lower() for lang in Language.all()}


def test_nllb_codes_named():
    assert iso_639_1("deu_Latn") == "de" and iso_639_1("ace_Arab") is None and iso_639_1("de_DE") == "de"
    # both Chinese scripts name "zh": neither takes it
    assert public_names(["deu_Latn", "zho_Hans", "zho_Hant", "ace_Arab"]) == {
        "deu_Latn": "de", "zho_Hans": "zho_Hans", "zho_Hant": "zho_Hant", "ace_Arab": "ace_Arab"}


def test_naming_without_lingua():
    # a GPU image without lingua's wheel loads an NLLB model with the same names
    code = ("import sys; sys.modules['lingua'] = None\n"
            "from nmt_serve.text.language_codes import iso_aliases\n"
            "print(sorted(iso_aliases(['deu_Latn', 'fra_Latn', 'ace_Arab']).items()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(sorted(iso_aliases(["deu_Latn", "fra_Latn", "ace_Arab"]).items()))
    assert "('de', 'deu_Latn')" in out
