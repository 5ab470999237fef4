// sd-bus from libsystemd: the D-Bus connection of keychain-secret-service (no GLib).
#include <systemd/sd-bus.h>
#include <poll.h>
#include <sys/eventfd.h>
// sd-journal: keychain-journal-relay's lines about a refused unit (OBJECT_SYSTEMD_UNIT=).
#include <systemd/sd-journal.h>
