#!/usr/bin/python3
"""Times Secret Service providers side by side (scripts/bench-secret-service.sh).

argv: NAME=ADDRESS[,freeze=PID] ..., one a provider on the session bus at ADDRESS. The providers are
measured interleaved, call by call (one call of each in turn, then the next round of calls), so the
machine's load, which moves by the minute here, falls on all of them alike. Prints one JSON object,
per provider: the median milliseconds of each measure, and beside each what it cost that provider
per call (its CPU time in microseconds and its threads' context switches, from /proc: they move less
with the load than wall time does). With freeze=PID, the process PID (that provider's TPM) is stopped
with SIGSTOP during the warm measures: a TPM command there would hang.
"""
import json, os, signal, statistics, subprocess, sys, time
import secretstorage, secretstorage.util, keyring
from keyring.backends import SecretService


def median_ms(samples):
    return round(statistics.median(samples) * 1000, 3)


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


class Provider:
    def __init__(self, spec):
        self.name, rest = spec.split('=', 1)
        self.address, *options = rest.split(',')
        self.freeze = next((int(o[len('freeze='):]) for o in options if o.startswith('freeze=')), None)
        self.env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS=self.address)
        os.environ['DBUS_SESSION_BUS_ADDRESS'] = self.address
        self.conn = secretstorage.dbus_init()
        self.pid = provider_pid(self.conn)
        self.coll = secretstorage.get_default_collection(self.conn)
        if self.coll.is_locked():
            self.coll.unlock()
        self.result = {}

    def use(self):
        """Makes this provider's bus the one new connections (keyring's, secret-tool's) go to."""
        os.environ['DBUS_SESSION_BUS_ADDRESS'] = self.address
        return self


providers = [Provider(spec) for spec in sys.argv[1:]]
n_items = int(os.environ.get('BENCH_ITEMS', '1000'))


def measured(name, calls, n):
    """calls: provider name -> a function. Each is called n times, the providers in turn each time: per
    provider, its median ms under name, and its CPU us and thread switches per call."""
    samples = {p.name: [] for p in providers}
    cost = {p.name: [0, 0, 0] for p in providers}
    for _ in range(n):
        for p in providers:
            fn = calls[p.name]
            p.use()
            before = counters(p.pid)
            t = time.perf_counter(); fn(); samples[p.name].append(time.perf_counter() - t)
            cost[p.name] = [a + b for a, b in zip(cost[p.name], spent(before, counters(p.pid)))]
    for p in providers:
        p.result[name] = median_ms(samples[p.name])
        p.result['provider CPU us per call: ' + name] = round(cost[p.name][0] / n / 1000, 1)
        p.result['provider thread switches per call: ' + name] = round(cost[p.name][1] / n, 2)


# CreateItem: n_items items in each, each with its own id and one attribute they share (this run's tag:
# a second round adds its own n_items to the collection).
tag = str(os.getpid())


def creator(p):
    numbers = iter(range(n_items))
    def create():
        i = next(numbers)
        p.coll.create_item('bench %d' % i, {'bench': tag, 'id': '%s-%d' % (tag, i)}, b'value-%d' % i)
    return create


measured('CreateItem', {p.name: creator(p) for p in providers}, n_items)
keyring.set_keyring(SecretService.Keyring())
for p in providers:
    p.use()
    subprocess.run(['secret-tool', 'store', '--label=lookup', 'bench-lookup', '1'], input=b'lookup-value', check=True, env=p.env)
    keyring.set_password('bench-service', 'alice', 'kr-value')
    [p.item] = p.coll.search_items({'id': tag + '-7'})
    assert p.item.get_secret() == b'value-7'  # the cold read (if any) is here, before the warm measures
    p.raw = p.coll._collection
    assert len(p.raw.call('SearchItems', 'a{ss}', {'bench': tag})[0]) == n_items
    # GetSecrets of 50 items in one call (what libsecret's secret_service_get_secrets_sync sends); read once
    # here so that the measure below is of warm items (a cold read would hang on the frozen TPM).
    service = secretstorage.util.DBusAddressWrapper(secretstorage.defines.SS_PATH, secretstorage.defines.SS_PREFIX + 'Service', p.conn)
    fifty = p.raw.call('SearchItems', 'a{ss}', {'bench': tag})[0][:50]
    session = p.item.session.object_path
    p.get_secrets = (lambda service=service, fifty=fifty, session=session: service.call('GetSecrets', 'aoo', fifty, session))
    assert len(p.get_secrets()[0]) == 50

for p in providers:
    if p.freeze:
        os.kill(p.freeze, signal.SIGSTOP)
try:
    measured('get_secret (warm, one connection)', {p.name: p.item.get_secret for p in providers}, 500)
    measured('GetSecrets of 50 items (warm, one call)', {p.name: p.get_secrets for p in providers}, 100)
    # The call itself (Collection.SearchItems), then as secretstorage uses it (an Item, so a Label Get, per result).
    measured('SearchItems call, %d match' % n_items,
             {p.name: (lambda raw=p.raw: raw.call('SearchItems', 'a{ss}', {'bench': tag})) for p in providers}, 50)
    measured('SearchItems call, 1 matches',
             {p.name: (lambda raw=p.raw: raw.call('SearchItems', 'a{ss}', {'id': tag + '-5'})) for p in providers}, 200)
    measured('secretstorage search_items, %d results' % n_items,
             {p.name: (lambda coll=p.coll: list(coll.search_items({'bench': tag}))) for p in providers}, 5)
    def get_password():
        assert keyring.get_password('bench-service', 'alice') == 'kr-value'
    measured('keyring.get_password', {p.name: get_password for p in providers}, 30)
    # The same call step by step (what keyring's SecretService backend does), to see where its time goes.
    # Beside each step's wall time, what it cost the provider: CPU time and thread switches, which
    # move less with the machine's load than wall time does.
    steps = {p.name: {} for p in providers}
    costs = {p.name: {} for p in providers}
    for _ in range(30):
        for p in providers:
            p.use()
            def step(name, fn):
                before = counters(p.pid)
                t = time.perf_counter(); value = fn(); steps[p.name].setdefault(name, []).append(time.perf_counter() - t)
                costs[p.name].setdefault(name, []).append(spent(before, counters(p.pid)))
                return value
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
    for p in providers:
        for name, samples in steps[p.name].items():
            p.result['keyring step: ' + name] = median_ms(samples)
            cost = costs[p.name][name]
            p.result['provider CPU us: ' + name] = round(statistics.median(c[0] for c in cost) / 1000, 1)
            p.result['provider thread switches: ' + name] = statistics.median(c[1] for c in cost)
            p.result['provider us waiting for a CPU: ' + name] = round(statistics.median(c[2] for c in cost) / 1000, 1)
    def lookup(p):
        def run():
            out = subprocess.run(['secret-tool', 'lookup', 'bench-lookup', '1'], capture_output=True, check=True, env=p.env).stdout
            assert out == b'lookup-value', out
        return run
    measured('secret-tool lookup (process)', {p.name: lookup(p) for p in providers}, 50)
finally:
    for p in providers:
        if p.freeze:
            os.kill(p.freeze, signal.SIGCONT)
for p in providers:
    p.result['items in the collection'] = len(p.raw.get_property('Items'))
print(json.dumps({p.name: p.result for p in providers}))
