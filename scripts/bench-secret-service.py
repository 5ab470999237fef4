#!/usr/bin/python3
"""Times one Secret Service provider on the session bus of DBUS_SESSION_BUS_ADDRESS (scripts/bench-secret-service.sh).

Prints one JSON object: the median milliseconds of each measure, and beside each what it cost the
provider per call (its CPU time in microseconds and its threads' context switches, from /proc:
they move less with the machine's load than wall time does). With --freeze PID, the process PID
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

def provider_pid(connection):
    from jeepney import DBusAddress, new_method_call
    bus = DBusAddress('/org/freedesktop/DBus', 'org.freedesktop.DBus', 'org.freedesktop.DBus')
    return connection.send_and_get_reply(new_method_call(bus, 'GetConnectionUnixProcessID', 's', ('org.freedesktop.secrets',))).body[0]

def counters(pid):
    """Per thread of the provider: its CPU time and time runnable but waiting for a CPU (ns, schedstat), and its
    context switches (voluntary + involuntary)."""
    out = {}
    for task in os.listdir('/proc/%d/task' % pid):
        try:
            ran, queued = open("/proc/%d/task/%s/schedstat" % (pid, task)).read().split()[:2]
            switches = sum(int(line.split()[1]) for line in open('/proc/%d/task/%s/status' % (pid, task))
                           if line.startswith(('voluntary_ctxt_switches', 'nonvoluntary_ctxt_switches')))
            out[task] = (int(ran), switches, int(queued))
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return out

def spent(before, after):
    """What the provider's threads did between two counters() (cpu ns, switches, waited ns): a thread that
    started meanwhile counts whole; one that ended meanwhile (libdispatch ends idle workers) is lost, so this
    may undercount, never count less than zero."""
    zero = (0, 0, 0)
    return [sum(max(0, a[i] - before.get(task, zero)[i]) for task, a in after.items()) for i in range(3)]

n_items = int(os.environ.get('BENCH_ITEMS', '1000'))
result = {}
conn = secretstorage.dbus_init()
pid = provider_pid(conn)

def measured(name, fn, n):
    """Times fn n times: its median ms under name, and the provider's CPU us and thread switches per call."""
    before = counters(pid)
    result[name] = median_ms(timed(fn, n))
    cost = spent(before, counters(pid))
    result['provider CPU us per call: ' + name] = round(cost[0] / n / 1000, 1)
    result['provider thread switches per call: ' + name] = round(cost[1] / n, 2)
coll = secretstorage.get_default_collection(conn)
if coll.is_locked():
    coll.unlock()

# CreateItem: n_items items, each with its own id and one attribute they share (this run's tag: a
# second round adds its own n_items to the collection).
tag = str(os.getpid())
numbers = iter(range(n_items))
def create():
    i = next(numbers)
    coll.create_item('bench %d' % i, {'bench': tag, 'id': '%s-%d' % (tag, i)}, b'value-%d' % i)
measured('CreateItem', create, n_items)
subprocess.run(['secret-tool', 'store', '--label=lookup', 'bench-lookup', '1'], input=b'lookup-value', check=True)
keyring.set_keyring(SecretService.Keyring())
keyring.set_password('bench-service', 'alice', 'kr-value')
[item] = coll.search_items({'id': tag + '-7'})
assert item.get_secret() == b'value-7'  # the cold read (if any) is here, before the warm measures

if freeze:
    os.kill(freeze, signal.SIGSTOP)
try:
    measured('get_secret (warm, one connection)', lambda: item.get_secret(), 500)
    # The call itself (Collection.SearchItems), then as secretstorage uses it (an Item, so a Label Get, per result).
    raw = coll._collection
    assert len(raw.call('SearchItems', 'a{ss}', {'bench': tag})[0]) == n_items
    measured('SearchItems call, %d match' % n_items, lambda: raw.call('SearchItems', 'a{ss}', {'bench': tag}), 50)
    measured('SearchItems call, 1 matches', lambda: raw.call('SearchItems', 'a{ss}', {'id': tag + '-5'}), 200)
    measured('secretstorage search_items, %d results' % n_items, lambda: list(coll.search_items({'bench': tag})), 5)
    assert keyring.get_password('bench-service', 'alice') == 'kr-value'
    measured('keyring.get_password', lambda: keyring.get_password('bench-service', 'alice'), 30)
    # The same call step by step (what keyring's SecretService backend does), to see where its time goes.
    # Beside each step's wall time, what it cost the provider: CPU time and thread switches, which
    # move less with the machine's load than wall time does.
    steps, costs = {}, {}
    def step(name, fn):
        before = counters(pid)
        t = time.perf_counter(); value = fn(); steps.setdefault(name, []).append(time.perf_counter() - t)
        costs.setdefault(name, []).append(spent(before, counters(pid)))
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
        cost = costs[name]
        result['provider CPU us: ' + name] = round(statistics.median(c[0] for c in cost) / 1000, 1)
        result['provider thread switches: ' + name] = statistics.median(c[1] for c in cost)
        result['provider us waiting for a CPU: ' + name] = round(statistics.median(c[2] for c in cost) / 1000, 1)
    def lookup():
        out = subprocess.run(['secret-tool', 'lookup', 'bench-lookup', '1'], capture_output=True, check=True).stdout
        assert out == b'lookup-value', out
    measured('secret-tool lookup (process)', lookup, 50)
finally:
    if freeze:
        os.kill(freeze, signal.SIGCONT)
result['items in the collection'] = len(coll._collection.get_property('Items'))
print(json.dumps(result))
