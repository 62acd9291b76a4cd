import { IStartForm, IStartOption } from '../model';
// the server's answer to GET /workbench/options (tests/unit/house/test_pool_options.py keeps it so)
import FORM_JSON from './start-form.json';

/** The start dialog as this package's server describes it (its interfaces fixed: lo and eth0). */
export const FORM = FORM_JSON as IStartForm;

/** A field PoolConfig does not have yet: the page's code has never been told of it. */
export const MARGIN: IStartOption = {
  name: 'walltime_margin',
  label: 'Walltime margin',
  unit: 's',
  help: 'seconds kept free before the allocation ends',
  kind: 'seconds',
  choices: [],
  default: null,
  hint: '300',
  launchers: ['slurm'],
  advanced: true
};
