#include <sqlite3.h>
// SQLITE_TRANSIENT is a cast macro and does not import.
static inline sqlite3_destructor_type kc_sqlite_transient(void) { return SQLITE_TRANSIENT; }
