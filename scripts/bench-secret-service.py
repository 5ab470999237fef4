#!/usr/bin/python3
"""Times one Secret Service provider on the session bus of DBUS_SESSION_BUS_ADDRESS (scripts/bench-secret-service.sh).

Prints one JSON object: the median milliseconds of each measure. With --freeze PID, the process PID
(the provider's TPM) is stopped with SIGSTOP during the warm measures: a TPM command there would hang.
"""
import json, os, signal, statistics, subprocess, sys, time
import secretstorage, secretstorage.util, keyring
from keyring.backends import SecretService

def median_ms(samples):
    return round(statistics.median(samples) * 1000, 3)

def timed(fn, n):
    out = []
    for _ in range(n):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return out

freeze = int(sys.argv[sys.argv.index('--freeze') + 1]) if '--freeze' in sys.argv else None
n_items = int(os.environ.get('BENCH_ITEMS', '1000'))
result = {}
conn = secretstorage.dbus_init()
coll = secretstorage.get_default_collection(conn)
if coll.is_locked():
    coll.unlock()

# CreateItem: n_items items, each with its own id and one attribute they share (this run's tag: a
# second round adds its own n_items to the collection).
tag = str(os.getpid())
created = []
for i in range(n_items):
    t = time.perf_counter()
    coll.create_item('bench %d' % i, {'bench': tag, 'id': '%s-%d' % (tag, i)}, b'value-%d' % i)
    created.append(time.perf_counter() - t)
result['CreateItem'] = median_ms(created)
subprocess.run(['secret-tool', 'store', '--label=lookup', 'bench-lookup', '1'], input=b'lookup-value', check=True)
keyring.set_keyring(SecretService.Keyring())
keyring.set_password('bench-service', 'alice', 'kr-value')
[item] = coll.search_items({'id': tag + '-7'})
assert item.get_secret() == b'value-7'  # the cold read (if any) is here, before the warm measures

if freeze:
    os.kill(freeze, signal.SIGSTOP)
try:
    result['get_secret (warm, one connection)'] = median_ms(timed(lambda: item.get_secret(), 500))
    # The call itself (Collection.SearchItems), then as secretstorage uses it (an Item, so a Label Get, per result).
    raw = coll._collection
    assert len(raw.call('SearchItems', 'a{ss}', {'bench': tag})[0]) == n_items
    result['SearchItems call, %d match' % n_items] = median_ms(timed(lambda: raw.call('SearchItems', 'a{ss}', {'bench': tag}), 50))
    result['SearchItems call, 1 matches'] = median_ms(timed(lambda: raw.call('SearchItems', 'a{ss}', {'id': tag + '-5'}), 200))
    result['secretstorage search_items, %d results' % n_items] = median_ms(timed(lambda: list(coll.search_items({'bench': tag})), 5))
    assert keyring.get_password('bench-service', 'alice') == 'kr-value'
    result['keyring.get_password'] = median_ms(timed(lambda: keyring.get_password('bench-service', 'alice'), 30))
    # The same call step by step (what keyring's SecretService backend does), to see where its time goes.
    steps = {}
    def step(name, fn):
        t = time.perf_counter(); value = fn(); steps.setdefault(name, []).append(time.perf_counter() - t)
        return value
    for _ in range(30):
        bus = step('connect (auth, Hello)', secretstorage.dbus_init)
        collection = step('default collection (Get Label)', lambda: secretstorage.get_default_collection(bus))
        step('collection Get Locked', collection.is_locked)
        [found] = step('SearchItems + Item (Get Label)', lambda: list(collection.search_items({'username': 'alice', 'service': 'bench-service'})))
        step('Unlock of the item', found.unlock)
        step('item Get Locked', found.is_locked)
        session = step('OpenSession (DH)', lambda: secretstorage.util.open_session(bus))
        found.session = session
        assert step('GetSecret + AES', found.get_secret) == b'kr-value'
        step('close', bus.close)
    for name, samples in steps.items():
        result['keyring step: ' + name] = median_ms(samples)
    def lookup():
        out = subprocess.run(['secret-tool', 'lookup', 'bench-lookup', '1'], capture_output=True, check=True).stdout
        assert out == b'lookup-value', out
    result['secret-tool lookup (process)'] = median_ms(timed(lookup, 50))
finally:
    if freeze:
        os.kill(freeze, signal.SIGCONT)
result['items in the collection'] = len(coll._collection.get_property('Items'))
print(json.dumps(result))
