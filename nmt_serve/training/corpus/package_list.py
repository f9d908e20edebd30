"""Which packages' message catalogs go into the corpus: a fixed list, so that every build reads the
same sources.

Every package of a release whose files include a German, French or Czech catalog would be thousands of
downloads, mostly of short, rarely reviewed catalogs. This list is chosen by hand instead: programs and
data whose catalogs are kept by large, reviewing translation teams (the GNU Translation Project, GNOME,
KDE, Xfce, MATE, LibreOffice, Debian's own tools), in everyday language (menus, dialogs, messages)
rather than only technical terms, and each download small next to what it holds: for LibreOffice only
the l10n packages of the three languages, whose catalogs are all of LibreOffice's interface. A package
that a release lacks, or that holds no catalog of these languages, is recorded as such in the manifest
(the list was checked against bookworm: where a program's catalogs live in a separate package, such as
e2fsprogs-l10n or libparted-i18n, that package is named).
"""
from __future__ import annotations

CATALOG_PACKAGES = tuple(sorted({
    # LibreOffice's whole interface, one package per language (about 4.4 MB of catalogs each)
    "libreoffice-l10n-cs", "libreoffice-l10n-de", "libreoffice-l10n-fr",
    # GNU and core system tools (Translation Project teams)
    "apt", "bash", "binutils-common", "coreutils", "cpio", "diffutils", "dpkg", "e2fsprogs-l10n", "findutils",
    "gawk", "gettext", "gettext-base", "grep", "libc-l10n", "man-db", "nano", "libparted-i18n", "procps", "psmisc",
    "sed", "sharutils", "sudo", "tar", "texinfo", "util-linux-locales", "wget", "wdiff", "gnupg-l10n",
    "aptitude-common", "debconf-i18n", "tasksel-data", "git", "mc-data", "mutt", "lynx-common",
    # names of countries, languages, currencies, keyboard layouts
    "iso-codes", "xkb-data",
    # GNOME
    "libglib2.0-data", "libgtk-3-common", "libgtk-4-common", "gnome-desktop3-data", "gnome-control-center-data",
    "nautilus-data", "gedit-common", "evince-common", "gnome-shell-common", "eog", "totem-common",
    "rhythmbox-data", "file-roller", "gnome-terminal-data", "gnome-calculator", "gnome-disk-utility",
    "gnome-system-monitor", "gnome-software-common", "evolution-data-server-common", "evolution-common",
    "simple-scan", "shotwell-common", "brasero-common", "gnome-maps", "cheese-common", "gnome-clocks",
    "gnome-weather", "gnome-text-editor", "orca", "gnome-contacts", "gnome-calendar", "gnome-characters", "baobab", "seahorse",
    # Xfce, MATE, Cinnamon
    "xfce4-panel", "thunar-data", "xfce4-settings", "mousepad", "ristretto", "xfce4-session",
    "mate-desktop-common", "mate-panel-common", "caja-common", "pluma-common", "cinnamon-l10n",
    # KDE applications
    "dolphin", "okular", "kate5-data", "konsole", "konsole-kpart", "ktexteditor-data", "libkf5i18n-data",
    # other desktop programs with complete de/fr/cs catalogs
    "gimp-data", "inkscape", "vlc-l10n", "audacity-data", "transmission-gtk", "pidgin-data",
    "hexchat-common", "filezilla-common", "gparted-common", "synaptic", "network-manager", "network-manager-gnome",
    "pavucontrol", "blueman", "gnucash-common", "meld", "gramps", "gnumeric-common",
    "geany-common", "gthumb-data", "claws-mail-i18n", "poedit-common",
}))
